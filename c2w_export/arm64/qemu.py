"""Host side: ExecuTorch methods run by the aarch64 runtime (runtime.py) under QEMU, one process per run.

An aarch64 process costs ~30 s of imports under emulation and each call is 45-70x slower than on the
host, so a run carries every job of a test (programs, methods, calls) to one process (guest.py).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .runtime import CPUS, QEMU, Unavailable, ready

GUEST = Path(__file__).with_name("guest.py")


@dataclass(frozen=True)
class Job:
    """Calls of one method of one .pte. `calls`: each call's inputs (numpy or torch). `stream`: calls after
    the first take their state (inputs[1:]) from the previous call's outputs[1:], computed on ARM."""

    id: str
    pte: Path
    method: str
    calls: list = field(hash=False)
    stream: bool = False


@dataclass(frozen=True)
class Run:
    """-> outputs[job id][call] = [output arrays]; report: the guest's (hwcaps, seconds per call)."""

    cpu: str
    outputs: dict
    report: dict


def environment(root: Path, cpu: str, home: str) -> dict:
    """The aarch64 process's whole environment: QEMU's CPU model and sysroot (that model's cpuinfo), the
    aarch64 site-packages, one thread; nothing of the host's Python."""
    return {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "QEMU_LD_PREFIX": str(root / "cpu" / cpu),
            "QEMU_CPU": cpu, "PYTHONPATH": f"{root / 'site'}:{root / 'site_cuda'}", "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}


def run(root: Path, cpu: str, jobs: list[Job], timeout: float = 1800.0) -> Run:
    """Every job on the emulated `cpu` (a runtime.CPUS model). Unavailable when the runtime is not
    prepared; RuntimeError naming the CPU and the guest's last lines when the aarch64 process fails."""
    if cpu not in CPUS:
        raise ValueError(f"unknown CPU model {cpu!r}; choose from {sorted(CPUS)}")
    root = Path(ready(root)["root"])
    with tempfile.TemporaryDirectory(prefix="c2w-arm64-") as tmp:
        arrays, plan = {}, []
        for job in jobs:
            names = []
            for i, call in enumerate(job.calls):
                names.append([])
                for k, x in enumerate(call):
                    name = f"{job.id}/{i}/{k}"
                    arrays[name] = np.ascontiguousarray(x.numpy() if hasattr(x, "numpy") else x)
                    names[-1].append(name)
            plan.append({"id": job.id, "pte": str(Path(job.pte).resolve()), "method": job.method, "calls": names,
                         "stream": job.stream})
        np.savez(Path(tmp) / "inputs.npz", **arrays)
        (Path(tmp) / "plan.json").write_text(json.dumps({"jobs": plan}))
        try:
            r = subprocess.run([QEMU, str(root / "sysroot" / "usr" / "bin" / "python3.11"), str(GUEST), tmp],
                               env=environment(root, cpu, tmp),
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the aarch64 run on {cpu} took over {timeout:.0f} s") from None
        if r.returncode or not (Path(tmp) / "report.json").exists():
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:])
            raise RuntimeError(f"the aarch64 run on {cpu} failed (exit {r.returncode}): {tail[-600:]}")
        report = json.loads((Path(tmp) / "report.json").read_text())
        with np.load(Path(tmp) / "outputs.npz") as z:
            flat = {k: z[k] for k in z.files}
    outputs: dict = {}
    for key in sorted(flat, key=lambda k: (k.rsplit("/", 2)[0], int(k.rsplit("/", 2)[1]), int(k.rsplit("/", 2)[2]))):
        job, i, _ = key.rsplit("/", 2)
        calls = outputs.setdefault(job, [])
        if len(calls) <= int(i):
            calls.append([])
        calls[int(i)].append(flat[key])
    return Run(cpu, outputs, report)


__all__ = ["Job", "Run", "run", "Unavailable"]
