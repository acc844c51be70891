"""Checksummed, atomic downloads (standard library only)."""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

_CHUNK = 1 << 20
# Seconds to wait before retry n (times n); tests set it to 0.
RETRY_WAIT_S = 2.0


class DownloadError(RuntimeError):
    """A download failed for a network or HTTP reason (the message names the URL)."""


class ChecksumError(ValueError):
    """Downloaded bytes do not match the expected md5 (the bad file is quarantined as .corrupt)."""


class _Truncated(Exception):
    def __init__(self, got: int, expected: int) -> None:
        super().__init__(f"connection closed after {got} of {expected} bytes")


def md5sum(path: Path) -> str:
    """Hex md5 of a file, read in chunks."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


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


def fetch(url: str, dest: Path, md5: str | None, *, timeout: float = 60, retries: int = 2) -> Path:
    """Download `url` to `dest` unless `dest` already has the md5; verify it and rename atomically.

    Network errors, 5xx responses and truncated bodies are retried `retries` times. A body that keeps
    arriving truncated, or arrives whole with the wrong md5, is moved to ``<dest>.corrupt`` and raises
    ChecksumError; a later call downloads it again. ``md5=None`` is for the rare file whose publisher
    prints no checksum: only its length is checked, an existing copy is kept, and the caller records
    the md5 it got (the download step's MANIFEST.json).
    """
    dest = Path(dest)
    md5 = None if md5 is None else md5.lower()
    if dest.exists():
        if md5 is None or md5sum(dest) == md5:
            return dest
        # A stale or damaged copy (e.g. the upstream file changed): keep it for inspection, fetch anew.
        _quarantine(dest, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(RETRY_WAIT_S * attempt)
        try:
            _stream(url, part, timeout)
        except urllib.error.HTTPError as e:
            part.unlink(missing_ok=True)
            if e.code < 500 or attempt == retries:
                raise DownloadError(f"HTTP {e.code} {e.reason} while downloading {url}") from e
            continue
        except _Truncated as e:
            if attempt == retries:
                bad = _quarantine(part, dest)
                raise ChecksumError(f"truncated download of {dest.name} from {url}: {e}; expected md5 {md5}, "
                                    f"actual md5 {md5sum(bad)}; quarantined as {bad}") from None
            continue
        except (urllib.error.URLError, OSError) as e:  # OSError covers timeouts and connection resets
            part.unlink(missing_ok=True)
            if attempt == retries:
                raise DownloadError(f"could not download {url}: {e}") from e
            continue
        actual = md5sum(part) if md5 is not None else None
        if actual != md5:
            bad = _quarantine(part, dest)
            raise ChecksumError(f"md5 mismatch for {dest.name} downloaded from {url}: expected {md5}, "
                                f"actual {actual}; quarantined as {bad}")
        os.replace(part, dest)
        return dest
    raise AssertionError("unreachable")  # the loop returns or raises on its last attempt
