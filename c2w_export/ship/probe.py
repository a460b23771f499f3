"""Run a shipped ExecuTorch file in a child process before this process touches it.

The sha256 in the manifest catches a damaged file; a damaged file behind a manifest re-hashed to
match it (a broken tool, a swapped file) reaches the runtime, and some damage kills the runtime's
process (SIGSEGV, SIGABRT: measured by tests/test_fuzz.py on flipped bits of a .pte and a .bpte).
So `verify` and `decode` first load the file, load its methods and run each once in a child (and
`verify` runs the bundled vectors only in a child, `in_child`): a child killed by a signal, or one that hangs, becomes one line naming
the file, and this process never runs it. Python errors in the child are left to this process,
which meets them again and reports them itself.

The child is a fork of this process (fast: the imports are done). Once this process has loaded an
ExecuTorch method, a fork that runs one hangs (measured: the runtime's threads are not in the
child), so from then on the probe's child only loads the file and its methods, and `verify` runs the
bundled vectors in this process: in such a process (a test session, an app that opens artifacts
twice) a file that crashes only when run is not caught here. The CLI's verify and decode are fresh
processes: they get the full check.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Mapping

import torch

from ..program import flows
from ..program.runner import warm_up_inputs
from ..program.variants import MethodSpec

TIMEOUT_S = 600.0  # a real-size .pte loads and runs in seconds; a child silent this long is hung


def _run_program(path: str, specs: Mapping[str, MethodSpec], run: bool) -> None:
    loaded = flows.ExecuTorchLoaded(Path(path))
    loaded.preload(list(specs))
    for method, spec in specs.items() if run else ():
        loaded.run(method, [x.contiguous() for x in warm_up_inputs(spec)])


def _probe(path: str, specs: Mapping[str, MethodSpec], run: bool) -> None:
    flows.QUIET_NATIVE = True
    try:
        with flows.native_quiet():
            _run_program(path, specs, run)
    except Exception:  # a Python error: this process meets it again and names it
        pass


def _wait(pid: int, timeout: float) -> str | None:
    """Wait for a child -> None when it exited, else why not (a signal, or no end within `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"did not finish in {timeout:g} s (hung)"
        time.sleep(0.01)
    if os.WIFSIGNALED(status):
        return f"crashed the ExecuTorch runtime ({signal.Signals(os.WTERMSIG(status)).name})"
    return None


def probe_program(path: Path, specs: Mapping[str, MethodSpec], timeout: float = TIMEOUT_S) -> str | None:
    """Load and run every method of `specs` {method: spec} of the .pte at `path` once (only load them
    once this process has run a method) in a child -> None when the child lived, else why it did
    not (a signal, or no end within `timeout`)."""
    run = not flows.EXECUTORCH_RAN  # see the module's docstring
    return in_child(_probe, str(path), dict(specs), run, timeout=timeout)[1]


def in_child(fn, *args, timeout: float = TIMEOUT_S) -> tuple[object, str | None]:
    """fn(*args) -> a JSON value, computed in a child -> (value, None), or (None, why the child did
    not finish: a signal, no end within `timeout`, or a Python error). For work whose damage may
    not crash the same way twice (a bundle's vectors read where a flipped offset points), so this
    process never runs it. Once this process has run an ExecuTorch method, `fn` may only load (the
    callers check flows.EXECUTORCH_RAN). A fork, not multiprocessing: a daemonic process may not
    start one, and nothing is pickled."""
    flows.runtime()  # imported here once (~3 s), so the child starts with it
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        pid = os.fork()
        if pid == 0:
            try:
                # a child that dies is this function's answer (`why`, one line), not a fault to dump:
                # no "Fatal Python error" stack from a handler the parent installed (pytest's, for one)
                faulthandler.disable()
                # a fork holds only the thread that forked: once this process has computed on OpenMP's
                # threads, a parallel op in the child waits for them forever (measured: a hang in
                # Method.execute). One thread, as torch's DataLoader workers do after a fork.
                torch.set_num_threads(1)
                flows.QUIET_NATIVE = True
                out.write_text(json.dumps(fn(*args)))
            finally:
                os._exit(0)
        why = _wait(pid, timeout)
        if why is None and not out.exists():
            why = "failed in a child process"
        return (None, why) if why else (json.loads(out.read_text()), None)
