"""Files in and out: atomic writes (a temp file in the same directory, then rename, so no partial
file is ever left behind), JSON reading with a named error, and sha256 of a file."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def _no_constant(name: str):
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def read_json(path: Path, error: type[Exception], max_bytes: int | None = None):
    """Parse a JSON file; malformed content (NaN and Infinity too: not JSON) raises `error` naming
    the file, and so does a file over `max_bytes`, before it is read."""
    path = Path(path)
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise error(f"{path}: {path.stat().st_size} bytes, over the {max_bytes}-byte limit for this file")
    try:
        return json.loads(path.read_text(), parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
