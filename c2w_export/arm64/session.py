"""Host side, call by call: one aarch64 process that stays up (guest.py serve) and runs each call it is sent.

For checks that draw their next call from the last one (the conformance plugin's Hypothesis checks),
where a batch (qemu.run) cannot be planned ahead. `on_arm(session)` turns a program loaded on the host
into one whose calls run on ARM: the conformance plugin's `--c2w-arch aarch64`.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Sequence

import torch

from ..program.flows import ExecuTorchLoaded, FlowError, Loaded
from .guest import receive, send
from .qemu import GUEST, environment
from .runtime import CPUS, QEMU, ready


class Session:
    """An aarch64 process on the emulated `cpu`, started on first use; `execute(pte, method, inputs)`.
    The process dies with this one (its pipes close) or on close()."""

    def __init__(self, root: Path, cpu: str):
        if cpu not in CPUS:
            raise ValueError(f"unknown CPU model {cpu!r}; choose from {sorted(CPUS)}")
        self.root, self.cpu = Path(ready(root)["root"]), cpu
        self._proc, self._lock, self._stderr = None, threading.Lock(), b""

    @property
    def arch(self) -> str:
        return f"aarch64-{self.cpu}"

    def _start(self) -> None:
        to_guest_r, self._to_guest = os.pipe()
        self._from_guest, from_guest_w = os.pipe()
        # requests and answers on pipes of their own (QEMU user mode passes fds through): the guest's stdout and
        # stderr stay free for the runtime's logs
        self._proc = subprocess.Popen(
            [QEMU, str(self.root / "sysroot" / "usr" / "bin" / "python3.11"), str(GUEST), "--serve",
             str(to_guest_r), str(from_guest_w)],
            env=environment(self.root, self.cpu, str(self.root)), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(to_guest_r, from_guest_w))
        os.close(to_guest_r)
        os.close(from_guest_w)

    def execute(self, pte: Path, method: str, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with self._lock:
            if self._proc is None:
                self._start()
            try:
                send(self._to_guest, {"pte": str(Path(pte).resolve()), "method": method,
                                       "inputs": [x.contiguous() for x in inputs]})
                reply = receive(self._from_guest)
            except (EOFError, BrokenPipeError):
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                tail = " | ".join(err.strip().splitlines()[-3:])
                raise FlowError(f"the aarch64 process ({self.cpu}) ended: {tail[-400:]}") from None
        if "error" in reply:
            raise FlowError(f"on aarch64 ({self.cpu}): {reply['error']}")
        return tuple(reply["outputs"])

    def close(self) -> None:
        if self._proc is not None:
            for fd in (self._to_guest, self._from_guest):
                os.close(fd)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None


class ArmLoaded(Loaded):
    """A .pte loaded on the host (its metadata: io_meta, methods) whose calls run on ARM."""

    def __init__(self, host: ExecuTorchLoaded, session: Session):
        self.host, self.session = host, session
        self.methods, self.source = host.methods, f"{host.source} on {session.arch}"

    def run(self, method, inputs):
        return self.session.execute(Path(self.host.source), method, inputs)

    def io_meta(self, method):
        return self.host.io_meta(method)


def on_arm(session: Session):
    """(loaded program) -> the same program with its calls on ARM; only ExecuTorch programs run there."""
    def wrap(loaded: Loaded) -> Loaded:
        if not isinstance(loaded, ExecuTorchLoaded):
            raise FlowError(f"{loaded.source or 'this program'}: only ExecuTorch .pte programs run on aarch64")
        return ArmLoaded(loaded, session)
    return wrap
