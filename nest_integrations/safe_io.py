"""Safe persistence helpers: atomic folder writes and sha256 checksums.

Every saved artefact of the project (NEST indexes, the LangChain vector store)
is a folder written through :func:`atomic_folder` and checked with
:func:`sha256_file` on load. No pickle anywhere: loading never executes code.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def atomic_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder that replaces ``target`` when the block succeeds.

    A failure (or a crash) leaves ``target`` as it was; the old folder is
    removed only after the new one is in place.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}-old-{os.getpid()}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
