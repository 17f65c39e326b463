#!/usr/bin/env bash
# The executors' table (benchmarks/executors.py) and the window cost table
# (benchmarks/windows.py --part cost) on a GPU, in one command on a fresh machine with this
# repository checked out:
#
#     bash benchmarks/gpu.sh OUT_DIR            (or OUT=OUT_DIR bash benchmarks/gpu.sh)
#
# writes into OUT_DIR: machine.txt (GPU, driver, jax), executors.json / .md,
# windows_cost.json / .md and log.txt (everything printed), six files. The benchmarks stop
# after BENCH_TIMEOUT_S seconds (default 420: a third for the executors' table, the rest
# for the window table, whose JSON keeps every workload measured by then). The sizes,
# chosen to fit that, are BENCH_LENGTHS (100 400), BENCH_WINDOWS (1 4 16),
# BENCH_WORKLOADS (standard-ours recurrent-ours) and BENCH_REPEATS (5).
#
# What it installs, only when missing, and never into the Python environment itself (it may
# be shared): into a folder of its own on PYTHONPATH, with this repository first on it,
#   * the package's dependencies that do not import: from wheels in $WHEELS (default:
#     .whl/ in the repository), else from the package index. A machine that reaches no
#     index needs the wheels: on one that does, `bash benchmarks/gpu.sh --download-wheels
#     .whl` fetches those a GPU image with jax tends to lack (pure Python, about 3 MB, the
#     versions installed there; .whl/ is ignored by git: carry it with the repository);
#   * jax's GPU backend, when jax has none: `jax[cuda13]` or `jax[cuda12]` (the driver's
#     CUDA major version first) pinned to the installed jax's version.
# It stops with a message saying what is missing when it cannot install, and when jax
# still sees no GPU (BENCH_ALLOW_CPU=1 runs it on the CPU anyway, to try the script).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
fail() { echo "benchmarks/gpu.sh: $*" >&2; exit 1; }

dependencies=(brainstate brainunit brainevent saiunit array_api_compat)
if [ "${1:-}" = --download-wheels ]; then
    dest=${2:?--download-wheels needs the folder to write the wheels to}
    specs=()
    for name in "${dependencies[@]}"; do
        version=$(python3 -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
        [ -n "$version" ] || fail "$name is not installed here, so its version is unknown."
        specs+=("$name==$version")
    done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        -d "$dest" "${specs[@]}" || fail "could not download ${specs[*]} into $dest."
    echo "wrote ${specs[*]} into $dest"
    exit 0
fi

out=${1:-${OUT:-}}
[ -n "$out" ] || fail "give the output folder as the first argument or in OUT."
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1

# ------------------------------------------------------------------- the package
wheels=${WHEELS:-$repo/.whl}
site=$(mktemp -d)
export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}"
# the distributions the package and its dependencies need, by the module each provides
requirements=(jax:jax numpy:numpy optax:optax tqdm:tqdm matplotlib:matplotlib
              sklearn:scikit-learn saiunit:saiunit brainunit:brainunit brainevent:brainevent
              brainstate:brainstate array_api_compat:array_api_compat opt_einsum:opt_einsum)
missing=()
for entry in "${requirements[@]}"; do
    python3 -c "import ${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    if compgen -G "$wheels/*.whl" >/dev/null; then
        source=(--no-index --find-links "$wheels")
    else
        source=()
    fi
    python3 -m pip install -q --no-deps --no-compile --target "$site" "${source[@]}" \
        "${missing[@]}" || fail "could not install ${missing[*]} (from ${source[*]:-the \
package index}): on a machine that reaches the index, run 'bash benchmarks/gpu.sh \
--download-wheels .whl' and carry .whl with the repository."
fi
python3 -c 'import braintrace_conv' || fail "braintrace_conv does not import (above)."

# ------------------------------------------------------------------- jax's GPU backend
backend() { python3 -c 'import jax; print(jax.default_backend())' 2>/dev/null || true; }
if [ "$(backend)" != gpu ] && [ "${BENCH_ALLOW_CPU:-0}" != 1 ]; then
    version=$(python3 -c 'import jax; print(jax.__version__)')
    cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)
    [ -n "$cuda" ] || fail "jax $version has no GPU backend and nvidia-smi finds no GPU driver."
    extras=(cuda13 cuda12)
    [ "$cuda" -lt 13 ] && extras=(cuda12)
    for extra in "${extras[@]}"; do
        python3 -m pip install -q --target "$site" --find-links "$wheels" \
            "jax[$extra]==$version" && [ "$(backend)" = gpu ] && break
    done
    [ "$(backend)" = gpu ] || fail "jax $version sees no GPU, and jax[${extras[*]}]==$version \
(driver's CUDA $cuda) did not install from the package index or $wheels, or did not give it one."
fi

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
        || echo "no GPU (BENCH_ALLOW_CPU=1)"
    python3 -c 'import jax; print("jax", jax.__version__, jax.default_backend(), jax.devices())'
    nproc
} | tee "$out/machine.txt"

# ------------------------------------------------------------------- the tables
lengths=${BENCH_LENGTHS:-100 400}
windows=${BENCH_WINDOWS:-1 4 16}
workloads=${BENCH_WORKLOADS:-standard-ours recurrent-ours}
repeats=${BENCH_REPEATS:-5}
limit=${BENCH_TIMEOUT_S:-420}
start=$SECONDS
status=0
# word splitting of the size lists is intended
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 timeout $((limit / 3)) python3 benchmarks/executors.py \
    --lengths $lengths --repeats "$repeats" --out "$out/executors.json" \
    > "$out/executors.md" || status=$?
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 timeout $((limit - (SECONDS - start))) python3 benchmarks/windows.py \
    --part cost --workloads $workloads --lengths $lengths --windows $windows \
    --repeats "$repeats" --out "$out/windows_cost.json" > "$out/windows_cost.md" || status=$?
cat "$out/executors.md" "$out/windows_cost.md"
[ "$status" = 0 ] || fail "a benchmark stopped with status $status (124: it ran past its \
share of BENCH_TIMEOUT_S=$limit s; windows_cost.json holds the workloads it finished)."
