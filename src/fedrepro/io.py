"""Atomic file writes: a killed job never leaves a half-written file that a later rule would read."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp creates 0600; results on a shared cluster file system must be readable as usual
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def atomic_write_npz(path: str | os.PathLike, **arrays: Any) -> Path:
    """``np.savez`` to ``path`` atomically (through a handle: savez would append .npz to a bare temp name)."""
    import numpy as np

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    return atomic_write(path, write)


def open_npz(path: str | os.PathLike, what: str):
    """``np.load`` of an .npz whose failure names the file and the way out (a truncated or foreign file
    otherwise surfaces as a bare zipfile.BadZipFile)."""
    import zipfile

    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: corrupt or not a {what} ({type(exc).__name__}: {exc}); delete it and rerun "
                         "snakemake to rebuild it") from exc


# Bytes read at a time by read_npz_into (numpy reads .npz members in blocks of this size too)
READ_BLOCK_BYTES = 16 * 2**20


def read_npz_into(npz: np.lib.npyio.NpzFile, key: str, out: np.ndarray) -> np.ndarray:
    """Read array ``key`` of an open .npz (``open_npz``) into ``out``, a C-contiguous array of its shape and
    dtype (e.g. a slice of a larger array), a block at a time: np.load would build a new array, which a
    caller gathering several files into one then holds twice."""
    import numpy as np

    with npz.zip.open(f"{key}.npy") as fh:
        version = np.lib.format.read_magic(fh)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = header(fh)
        if shape != out.shape or dtype != out.dtype or fortran_order or not out.flags.c_contiguous:
            raise ValueError(f"{key} is {dtype} {shape}, cannot read it into a {out.dtype} {out.shape} array")
        target = memoryview(out.reshape(-1).view(np.uint8))
        for start in range(0, len(target), READ_BLOCK_BYTES):
            block = target[start : start + READ_BLOCK_BYTES]
            if fh.readinto(block) != len(block):
                raise ValueError(f"{key} ends before its {out.nbytes} bytes")
    return out


def _jsonable(obj: Any) -> Any:
    # numpy scalars and arrays show up in stats and summaries
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
