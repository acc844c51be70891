"""Atomic file writes: a killed job never leaves a half-written file that a later rule would read."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def _jsonable(obj: Any) -> Any:
    # numpy scalars and arrays show up in stats and summaries
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
