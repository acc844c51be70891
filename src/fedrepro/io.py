"""Atomic file writes: a killed job never leaves a half-written file that a later rule would read. What the
pipeline reads back (checkpoints, partitions, prepared data) also carries a checksum, verified on every read;
a damaged, unreadable or unwritable file fails naming itself and the way out."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# what to do about a damaged file that a rule wrote (checkpoints say their own way out)
REBUILD = "delete it and rerun; snakemake rebuilds it"


def rerun_command(output: str | os.PathLike) -> str:
    """How to rebuild ``output`` and everything computed from it. Deleting ``output`` is not enough: Snakemake
    leaves a missing intermediate file alone while the artifacts made from it are present ("Nothing to be done")."""
    return f"`snakemake --forcerun {output}`, with the --configfile and options of the run that failed"


# the errno of a failed write -> what to tell the user (else os.strerror)
WRITE_ERRORS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system"}


class DamagedFileError(ValueError):
    """A file the pipeline wrote that cannot be read back as written: damaged, truncated, not of its kind or
    without its checksum. The message names the file and what to do."""


def checksum_path(path: str | os.PathLike) -> Path:
    """Where the checksum of ``path`` lives: ``<path>.sha256``, one line as sha256sum writes it (so
    ``sha256sum -c`` checks it too)."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, checksum: bool = False) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``; with ``checksum``
    the file's sha256 goes to ``checksum_path(path)``. A failed write raises OSError naming ``path`` and the
    cause ("disk full"), also where the writer wrapped the system's error in its own (torch's)."""
    from fedrepro.data.download import file_digest

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp creates 0600; results on a shared cluster file system must be readable as usual
        os.chmod(tmp, 0o666 & ~_umask())
        if checksum:
            # while the file is renamed, its checksum file accepts the old content and the new: a kill between
            # the renames leaves one of the two, both whole (a resumable checkpoint stays resumable)
            digest, sidecar = file_digest(Path(tmp), "sha256"), checksum_path(path)
            try:
                accepted = recorded_checksums(sidecar)
            except (OSError, UnicodeDecodeError):  # none yet, or itself damaged: nothing vouches for the old
                accepted = []
            both = dict.fromkeys([digest, *accepted])
            atomic_write_text(sidecar, "".join(f"{d}  {path.name}\n" for d in both))
        os.replace(tmp, path)
    except Exception as exc:
        Path(tmp).unlink(missing_ok=True)
        failed = exc if isinstance(exc, OSError) else _os_error_in(exc)
        if failed is None:
            raise
        cause = WRITE_ERRORS.get(failed.errno) or (os.strerror(failed.errno) if failed.errno else str(failed))
        message = f"{path}: could not be written: {cause} ({failed})"
        raise (OSError(failed.errno, message) if failed.errno else OSError(message)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if checksum:
        atomic_write_text(sidecar, f"{digest}  {path.name}\n")
    return path


def _os_error_in(exc: BaseException) -> OSError | None:
    """The operating system's error behind ``exc``, if one is in its chain: torch's writer reports a full disk as
    RuntimeError("[enforce fail at inline_container.cc] unexpected pos ...") raised while handling the
    OSError(ENOSPC) that Python's file write raised."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str, *, checksum: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically (``checksum``: as atomic_write)."""
    return atomic_write(path, lambda tmp: tmp.write_text(text), checksum=checksum)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, checksum: bool = False) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically (``checksum``: as atomic_write)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n",
                             checksum=checksum)


def atomic_write_npz(path: str | os.PathLike, *, checksum: bool = False, **arrays: Any) -> Path:
    """``np.savez`` to ``path`` atomically (through a handle: savez would append .npz to a bare temp name;
    ``checksum``: as atomic_write)."""
    import numpy as np

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    return atomic_write(path, write, checksum=checksum)


def verify_checksum(path: str | os.PathLike, remedy: str = REBUILD) -> None:
    """Check ``path`` against its checksum (atomic_write's ``checksum``); DamagedFileError naming the file and
    ``remedy`` when it does not match or has none."""
    from fedrepro.data.download import file_digest

    path = Path(path)
    actual = file_digest(path, "sha256")  # first: a missing file is a FileNotFoundError naming it
    sidecar = checksum_path(path)
    try:
        accepted = recorded_checksums(sidecar)
    except FileNotFoundError:
        raise DamagedFileError(f"{path}: its checksum file {sidecar.name} is missing (written before checksums "
                               f"were kept, or deleted), so its content cannot be verified: {remedy}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedFileError(f"{path}: its checksum file {sidecar.name} is unreadable ({exc}): {remedy}") from exc
    if actual not in accepted:
        raise DamagedFileError(f"{path}: content does not match its checksum in {sidecar.name} (damaged or "
                               f"corrupt): {remedy}")


def recorded_checksums(sidecar: Path) -> list[str]:
    """The digests a checksum file accepts: the first word of each line (two while its file is replaced)."""
    return [line.split()[0] for line in sidecar.read_text().splitlines() if line.strip()]


def remove_checksummed(path: str | os.PathLike) -> None:
    """Delete ``path`` and its checksum file, whichever exist."""
    Path(path).unlink(missing_ok=True)
    checksum_path(path).unlink(missing_ok=True)


def read_json(path: str | os.PathLike, checksum: bool = False, remedy: str = REBUILD) -> Any:
    """The JSON in ``path`` (verified first with ``checksum``); invalid JSON raises DamagedFileError naming the
    file and ``remedy`` (a missing file stays a FileNotFoundError, which names it)."""
    path = Path(path)
    if checksum:
        verify_checksum(path, remedy)
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedFileError(f"{path}: not valid JSON ({type(exc).__name__}: {exc}): {remedy}") from exc


def listed_in_indexes(indexes: list[Path] | list[str], key: str) -> list[Path]:
    """The paths that job indexes (a train or finetune job's seeds.json: {"runs": [{key: name relative to the
    index's folder, ...}, ...]}) list under ``key`` ("dir": a train run's folder, "file": a fine-tuning record),
    in the indexes' order."""
    paths = []
    for index in map(Path, indexes):
        paths += [index.parent / run[key] for run in read_json(index)["runs"]]
    return paths


def job_seconds(index: str | os.PathLike) -> float | None:
    """The wall seconds a train job took, every attempt of a resumed one summed (its seeds.json's
    ``job_seconds``, which covers the runs' set-up and evaluations as well as their training); None for an index
    without it (a job run outside the workflow)."""
    return read_json(index).get("job_seconds")


@contextlib.contextmanager
def open_npz(path: str | os.PathLike, what: str, checksum: bool = True) -> Iterator[np.lib.npyio.NpzFile]:
    """``with open_npz(path, what) as z``: ``np.load`` of an .npz, verified against its checksum first (unless
    not ``checksum``); a damaged file, or a member that fails to read inside the block ("Bad CRC-32"), raises
    DamagedFileError naming the file and the way out instead of a bare zipfile.BadZipFile."""
    import zipfile
    import zlib

    import numpy as np

    def damaged(exc: BaseException) -> DamagedFileError:
        return DamagedFileError(f"{path}: corrupt or not a {what} ({type(exc).__name__}: {exc}); {REBUILD}")

    if checksum:
        verify_checksum(path)
    try:
        npz = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise damaged(exc) from exc
    with npz:
        try:
            yield npz
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise damaged(exc) from exc


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
