"""Files that a kill mid-write must never leave half-written: checkpoint seals, the job record
beside the checkpoints, a rank's failure record. Written beside the target, flushed to disk,
then renamed over it (a rename within one folder is atomic)."""

from __future__ import annotations

import os
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
