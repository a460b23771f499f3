"""An artifacts directory replaced in one step, so an export killed at any point (lowering,
serialization, the final moves) leaves the previous complete artifacts or nothing new.

An export writes everything, manifest included, into a staging directory beside the target
(`.<name>.staging-<pid>-*`, same filesystem), then commits it: a rename when the target is absent or
empty, otherwise an atomic exchange of the two directories (Linux renameat2 RENAME_EXCHANGE) after
which the old artifacts are removed. Where the exchange is not supported, two renames (the old
directory aside to `.<name>.old-<pid>`, the new one in); a kill between them is repaired by the next
export (`recover`). The target may only hold earlier artifacts: files a manifest does not name
could belong to anyone, and are never removed."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

MANIFEST = "manifest.json"
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100
# Tests only (tests/test_commit.py): the name of a point of an export at which its process kills
# itself with SIGKILL, so every step of the commit can be interrupted on purpose. Unset: no effect.
KILL_ENV = "C2W_TEST_KILL_AT"
KILL_POINTS = ("staged", "built", "manifest", "exchanged", "aside", "replaced")


def kill_point(name: str) -> None:
    """SIGKILL this process here when C2W_TEST_KILL_AT names this point (see KILL_POINTS)."""
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class CommitError(ValueError):
    """The output directory holds something other than earlier artifacts."""


def foreign_entries(target: Path) -> list[str]:
    """Visible entries of `target` that no manifest there names (empty: absent, empty, or artifacts)."""
    if not target.exists():
        return []
    if not target.is_dir():
        return [target.name]
    names = {p.name for p in target.iterdir() if not p.name.startswith(".")}
    if MANIFEST not in names:
        return sorted(names)
    names.discard(MANIFEST)
    try:
        for p in json.loads((target / MANIFEST).read_text()).get("programs", []):
            names.discard(str(p.get("path")))
            names.discard(str((p.get("bundle") or {}).get("path")))
    except (OSError, ValueError, AttributeError, TypeError):  # damaged earlier artifacts: program files are theirs
        names = {n for n in names if not n.endswith((".pte", ".pt2", ".bpte"))}
    return sorted(names)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(target: Path) -> None:
    """Undo what a killed export left beside `target`: a target moved aside but not replaced is
    moved back, and staging directories of processes that are gone are removed."""
    parent = target.parent
    if not parent.is_dir():
        return
    for p in parent.glob(f".{target.name}.old-*"):
        if not target.exists():
            p.rename(target)
        else:
            shutil.rmtree(p, ignore_errors=True)
    for p in parent.glob(f".{target.name}.staging-*"):
        pid = p.name.rsplit(".staging-", 1)[1].split("-", 1)[0]
        if not pid.isdigit() or not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def staging_for(target: Path) -> Path:
    """A fresh staging directory beside `target` (after `recover`); raises CommitError when the
    target holds files that are not artifacts."""
    target = Path(target)
    foreign = foreign_entries(target)
    if foreign:
        raise CommitError(f"--out-dir {target} holds {len(foreign)} file(s) that are not artifacts "
                          f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): export into an empty "
                          f"directory or over earlier artifacts")
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    return Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.staging-{os.getpid()}-"))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    return fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def commit(staging: Path, target: Path) -> None:
    """Put the complete artifacts in `staging` at `target` in one step (module docstring)."""
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        staging.rename(target)  # rename(2) replaces an empty directory in one step
        return
    if _exchange(staging, target):  # staging now holds the old artifacts
        kill_point("exchanged")
        shutil.rmtree(staging, ignore_errors=True)
        return
    aside = target.parent / f".{target.name}.old-{os.getpid()}"
    target.rename(aside)
    kill_point("aside")
    staging.rename(target)
    kill_point("replaced")
    shutil.rmtree(aside, ignore_errors=True)
