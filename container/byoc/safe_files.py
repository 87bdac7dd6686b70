"""Files written so that nothing can go half-way: records a kill mid-write must never leave cut
short (checkpoint seals, the job record, a rank's failure record: written beside the target, flushed,
then renamed over it), and archives unpacked only when every member is a plain file or folder."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` whole: readers see the old content or the new, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class UnsafeArchive(ValueError):
    """An archive member that could write outside the target or create something other than a file."""


def extract_archive(archive: Path, target: Path) -> None:
    """Unpack a tar archive (a model.tar.gz) into `target`, refusing links, devices and paths that
    leave `target` before anything is written. tarfile's `data` filter does this too, but it had
    bypasses before Python 3.12.11 / 3.11.13 (CVE-2025-4517 and others), and the images' Pythons vary."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for member in members:
            if not (member.isfile() or member.isdir()):
                kind = "link" if member.issym() or member.islnk() else "device or special file"
                raise UnsafeArchive(f"{member.name!r} is a {kind}; a model archive may hold only files and folders")
            parts = Path(member.name).parts
            if Path(member.name).is_absolute() or ".." in parts:
                raise UnsafeArchive(f"{member.name!r} would be written outside the folder it is unpacked into")
        tar.extractall(target, members=members, filter="data")
