#!/usr/bin/env bash
# The executors' table (benchmarks/executors.py) and the window cost table
# (benchmarks/windows.py --part cost) on a GPU, then the window cost table again on the
# same machine's CPU (JAX_PLATFORMS=cpu: every core of an otherwise idle machine), in one
# command on a fresh machine with this repository checked out:
#
#     bash benchmarks/gpu.sh OUT_DIR            (or OUT=OUT_DIR bash benchmarks/gpu.sh)
#
# writes into OUT_DIR eight files: machine.txt (GPU, driver, jax, cores, load average),
# executors.json / .md, windows_cost.json / .md (GPU), windows_cost_cpu.json / .md and
# log.txt (everything printed). The benchmarks stop after BENCH_TIMEOUT_S seconds (default
# 330, about 6 minutes with the installation): the GPU tables one after the other (a third
# for the executors' table) beside the CPU table, each on cores of its own (on fewer than 8
# cores, one after the other: to try the script); a window table's JSON keeps every
# workload measured by then. The sizes, chosen to fit that, are BENCH_LENGTHS
# (100 400), BENCH_WINDOWS (1 4 20), BENCH_WORKLOADS (standard-reset recurrent-reset),
# BENCH_REPEATS (5) and, for the CPU table, BENCH_CPU_REPEATS (3).
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
    echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

# ------------------------------------------------------------------- the tables
lengths=${BENCH_LENGTHS:-100 400}
windows=${BENCH_WINDOWS:-1 4 20}
workloads=${BENCH_WORKLOADS:-standard-reset recurrent-reset}
repeats=${BENCH_REPEATS:-5}
limit=${BENCH_TIMEOUT_S:-330}
# The GPU tables and the CPU one run side by side on cores of their own (the GPU tables on
# 4: the host's share of GPU work is compiling and launching), so the CPU table times on
# cores nothing else uses, and the whole fits the limit: compiling its 36 programs
# alone takes minutes.
gpu_cores=() cpu_cores=()
cores=$(nproc)
if [ "$cores" -ge 8 ] && command -v taskset >/dev/null; then
    gpu_cores=(taskset -c 0-3) cpu_cores=(taskset -c "4-$((cores - 1))")
fi
# word splitting of the size lists is intended
# shellcheck disable=SC2086
window_table() {   # OUT_NAME REPEATS SECONDS: the window cost table, on jax's default backend
    PYTHONUNBUFFERED=1 timeout "$3" python3 benchmarks/windows.py --part cost \
        --workloads $workloads --lengths $lengths --windows $windows --repeats "$2" \
        --out "$out/$1.json" > "$out/$1.md"
}
gpu_tables() {
    local start=$SECONDS status=0
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout $((limit / 3)) python3 benchmarks/executors.py \
        --lengths $lengths --repeats "$repeats" --out "$out/executors.json" \
        > "$out/executors.md" || status=$?
    window_table windows_cost "$repeats" $((limit - (SECONDS - start))) || status=$?
    return "$status"
}
echo "the GPU tables on cores ${gpu_cores[2]:-all}, the CPU table on cores ${cpu_cores[2]:-all}" \
    | tee -a "$out/machine.txt"
"${gpu_cores[@]}" bash -c "$(declare -p out limit lengths windows workloads repeats); \
    $(declare -f window_table gpu_tables); gpu_tables" &
gpu=$! status=0
if [ ${#cpu_cores[@]} -eq 0 ]; then        # too few cores to share: one after the other
    wait "$gpu" || status=$?
    gpu=
fi
JAX_PLATFORMS=cpu "${cpu_cores[@]}" bash -c "$(declare -p out lengths windows workloads); \
    $(declare -f window_table); window_table windows_cost_cpu ${BENCH_CPU_REPEATS:-3} $limit" \
    2> >(sed -u 's/^/[cpu] /' >&2) &
cpu=$!
[ -z "$gpu" ] || wait "$gpu" || status=$?
wait "$cpu" || status=$?
cat "$out/executors.md" "$out/windows_cost.md" "$out/windows_cost_cpu.md"
[ "$status" = 0 ] || fail "a benchmark stopped with status $status (124: it ran past its \
share of BENCH_TIMEOUT_S=$limit s; the window tables' JSON holds the workloads they finished)."
