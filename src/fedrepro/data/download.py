"""Checksummed, atomic downloads (standard library only)."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable
from pathlib import Path

_CHUNK = 1 << 20
# Seconds to wait before retry n (times n); tests set it to 0.
RETRY_WAIT_S = 2.0


class DownloadError(RuntimeError):
    """A download failed for a network or HTTP reason (the message names the URL)."""


class ChecksumError(ValueError):
    """A file fails its content checks (md5 or sha256, and decompressed sha256 where known), or has none to
    pass; the message names the file and each check that failed. A downloaded file is quarantined as
    .corrupt; a local or hand-placed copy is left where it is."""


class _Truncated(Exception):
    def __init__(self, got: int, expected: int) -> None:
        super().__init__(f"connection closed after {got} of {expected} bytes")


def file_digest(path: Path, algorithm: str = "md5") -> str:
    """Hex digest of a file (``algorithm``: a hashlib name), read in chunks."""
    h = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def md5sum(path: Path) -> str:
    """Hex md5 of a file, read in chunks."""
    return file_digest(path, "md5")


def digest_kind(checksum: str) -> str:
    """The algorithm of a pinned checksum, told by its length: 32 hex digits md5, 64 sha256 (a publisher
    prints one or the other)."""
    kind = {32: "md5", 64: "sha256"}.get(len(checksum))
    if kind is None or any(c not in "0123456789abcdef" for c in checksum.lower()):
        raise ValueError(f"checksum {checksum!r} is neither an md5 (32 hex digits) nor a sha256 (64)")
    return kind


def payload_sha256(path: Path) -> str:
    """Hex sha256 of a gzip file's decompressed bytes: the same for every recompression of one payload.

    Raises EOFError, gzip.BadGzipFile or zlib.error on a truncated or damaged stream.
    """
    h = hashlib.sha256()
    with gzip.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def content_problem(path: Path, checksum: str | None, payload_sha: str | None = None) -> str | None:
    """None when `path` has the pinned `checksum` (md5 or sha256 of its bytes, see digest_kind) or, for a
    gzip file, the expected decompressed sha256; otherwise each check that failed, in words.

    The publisher's checksum covers the compressed bytes, which a repackager (Debian recompresses its
    dataset-* packages) changes without touching the content: the sha256 of the decompressed payload
    accepts such a copy, while a truncated or altered one fails both. With neither checksum any file
    passes (fetch refuses such a download unless told otherwise).
    """
    if checksum is None and payload_sha is None:
        return None
    failed = []
    if checksum is not None:
        kind = digest_kind(checksum)
        actual = file_digest(path, kind)
        if actual == checksum.lower():
            return None
        failed.append(f"{kind} mismatch: expected {checksum.lower()}, actual {actual}")
    if payload_sha is not None:
        try:
            actual_sha = payload_sha256(path)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            failed.append(f"decompressed sha256 not computable: damaged or truncated gzip stream ({e})")
        else:
            if actual_sha == payload_sha.lower():
                return None
            failed.append(f"decompressed sha256 mismatch: expected {payload_sha.lower()}, actual {actual_sha}")
    return "; ".join(failed)


def copy_local(fname: str, dirs: Iterable[Path | str], dest: Path, checksum: str | None, *,
               payload_sha: str | None = None) -> Path | None:
    """Copy `fname` from the first of `dirs` that has it to `dest`, checked as a download is; None when
    none has it.

    A `dest` that already passes is kept. A copy that fails its checks raises ChecksumError naming it
    and the check that failed, and stays where it is (a system package's file is not ours to move);
    nothing of it is left at `dest`. An older `dest` that fails its checks is quarantined as
    ``<dest>.corrupt`` before the copy, as fetch does.
    """
    dest = Path(dest)
    source = next((Path(d) / fname for d in dirs if (Path(d) / fname).is_file()), None)
    if source is None:
        return None
    part = _part_unless_kept(dest, checksum, payload_sha)
    if part is None:
        return dest
    shutil.copyfile(source, part)
    # check the copy rather than the source: what is kept is what was checked
    problem = content_problem(part, checksum, payload_sha)
    if problem is not None:
        part.unlink()
        raise ChecksumError(f"local copy {source} refused: {problem}. Repair or remove it, or drop its "
                            f"directory from the config's local_data_dirs to download {fname} instead")
    os.replace(part, dest)
    return dest


def check_placed(path: Path, checksum: str, remedy: str) -> Path:
    """``path``, a file put in place by hand, when it has the ``checksum`` its instructions print (md5 or
    sha256); otherwise ChecksumError naming it, the check that failed and ``remedy`` (what to do). The
    file is left where it is: it is the user's copy, not a download of ours to quarantine."""
    problem = content_problem(path, checksum)
    if problem is not None:
        raise ChecksumError(f"{path} refused: {problem}. {remedy} (for a copy you trust whose bytes differ, "
                            f"give its checksum under the config key checksums instead)")
    return path


def _quarantine(path: Path, dest: Path) -> Path:
    bad = dest.with_name(dest.name + ".corrupt")
    os.replace(path, bad)  # replaces an older .corrupt: only the latest bad copy is worth inspecting
    return bad


def _stream(url: str, part: Path, timeout: float) -> None:
    """Write the body of `url` to `part`; raise _Truncated when fewer bytes than announced arrive."""
    with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
        length = resp.headers.get("Content-Length")
        got = 0
        while chunk := resp.read(_CHUNK):
            out.write(chunk)
            got += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    # http.client returns a short body silently when the peer closes early, so count the bytes ourselves.
    if length is not None and got != int(length):
        raise _Truncated(got, int(length))


def _part_unless_kept(dest: Path, checksum: str | None, payload_sha: str | None) -> Path | None:
    """None when ``dest`` already passes its checks (keep it); otherwise the ``.part`` path to write the new
    copy to, after quarantining a stale or damaged ``dest`` (e.g. the upstream file changed) for inspection."""
    if dest.exists():
        if content_problem(dest, checksum, payload_sha) is None:
            return None
        _quarantine(dest, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.with_suffix(dest.suffix + ".part")


def fetch(url: str, dest: Path, checksum: str | None, *, payload_sha: str | None = None, timeout: float = 60,
          retries: int = 2, unpinned_ok: bool = False) -> Path:
    """Download `url` to `dest` unless `dest` already passes its checks; verify it and rename atomically.

    The checks (content_problem): the pinned `checksum` (the publisher's md5 or sha256, or one a public
    loader pins where the publisher prints none), or the decompressed sha256 `payload_sha` of a gzip
    file where given (either passing is enough). Network errors, 5xx responses and truncated bodies are
    retried `retries` times. A body that keeps arriving truncated, or arrives whole and fails its
    checks, is moved to ``<dest>.corrupt`` and raises ChecksumError; a later call downloads it again.
    A download with neither checksum raises ChecksumError before any request, unless `unpinned_ok`
    (for a caller that checks the file itself afterwards, as the weights' sha256 prefix): then only its
    length is checked and an existing copy is kept.
    """
    dest = Path(dest)
    if checksum is None and payload_sha is None and not unpinned_ok:
        raise ChecksumError(f"{dest.name}: no checksum is pinned for {url}, and every download needs one: give "
                            f"the md5 or sha256 you trust for it under the config key checksums "
                            f"({{data set: {{{dest.name}: ...}}}})")
    # the algorithm a truncated body is reported in (md5 for an unpinned file); checked before any request
    kind = "md5" if checksum is None else digest_kind(checksum)
    checksum = None if checksum is None else checksum.lower()
    placed = dest.exists()
    part = _part_unless_kept(dest, checksum, payload_sha)
    if part is None:
        return dest
    # a copy put there by hand (no network) that failed its checks: say so if the network cannot replace it
    refused = (f"; the {dest.name} already in {dest.parent} failed its checks and was moved to {dest.name}.corrupt"
               f": put the file its instructions name there, with the checksum they print") if placed else ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(RETRY_WAIT_S * attempt)
        try:
            _stream(url, part, timeout)
        except urllib.error.HTTPError as e:
            part.unlink(missing_ok=True)
            if e.code < 500 or attempt == retries:
                raise DownloadError(f"HTTP {e.code} {e.reason} while downloading {url}{refused}") from e
            continue
        except _Truncated as e:
            if attempt == retries:
                bad = _quarantine(part, dest)
                raise ChecksumError(f"truncated download of {dest.name} from {url}: {e}; expected {kind} "
                                    f"{checksum}, actual {kind} {file_digest(bad, kind)}; quarantined as {bad}"
                                    ) from None
            continue
        except (urllib.error.URLError, OSError) as e:  # OSError covers timeouts and connection resets
            part.unlink(missing_ok=True)
            if attempt == retries:
                raise DownloadError(f"could not download {url}: {e}{refused}") from e
            continue
        problem = content_problem(part, checksum, payload_sha)
        if problem is not None:
            bad = _quarantine(part, dest)
            raise ChecksumError(f"{dest.name} downloaded from {url} failed its checks: {problem}; "
                                f"quarantined as {bad}")
        os.replace(part, dest)
        return dest
    raise AssertionError("unreachable")  # the loop returns or raises on its last attempt
