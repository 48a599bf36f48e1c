"""Files written whole or not at all: write a hidden temporary file, then rename it over
the target (a rename is atomic on POSIX), so a process killed mid-write never leaves a
broken checkpoint, snapshot or dataset shard behind."""

import os
from pathlib import Path

import numpy as np


def _temporary(path: Path) -> Path:
    # Hidden and without the target's suffix: globs such as "shard-*.npz" never see it.
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def save_npz(
    path: str | Path, arrays: dict, compressed: bool = False, durable: bool = False
) -> None:
    """Writes `arrays` as an .npz file at `path` (its directory is created); `durable`:
    fsynced, file and directory, before this returns (it survives a lost machine)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    with tmp.open("wb") as f:
        (np.savez_compressed if compressed else np.savez)(f, **arrays)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Writes `data` to `path`."""
    path = Path(path)
    tmp = _temporary(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)
