"""Runs inside the aarch64 interpreter: ExecuTorch methods called on given inputs, in a batch or call by call.

usage: python guest.py REQUEST_DIR          (qemu.run: a batch)
       python guest.py --serve FD_IN FD_OUT  (session.Session: call by call)

REQUEST_DIR/plan.json: {"jobs": [{"id", "pte", "method", "calls": [[input name, ...], ...], "stream": bool}]}
REQUEST_DIR/inputs.npz: the named input arrays.
A stream's calls after the first take their state from the previous call's outputs (outputs[1:]), as a
phone streams; other calls take exactly the named inputs. Writes REQUEST_DIR/outputs.npz (key
"<id>/<call>/<output>") and REQUEST_DIR/report.json (the CPU's hwcaps, seconds per call), atomically.

--serve reads requests from FD_IN, each an 8-byte little-endian length and a torch.save of {"pte", "method",
"inputs"}, and answers each on FD_OUT the same way: {"outputs": [...]} or {"error": "<type>: <message>"}. A
zero length or the end of FD_IN ends it.

Imports only numpy, torch and executorch.runtime: nothing of c2w_export, so this one file is the guest.
"""

import ctypes
import json
import os
import platform
import sys
import time


def hwcaps() -> dict:
    """What the (emulated) CPU advertises: AT_HWCAP bits 9/10 are FP16 scalar/vector arithmetic."""
    if platform.machine() != "aarch64":
        return {}
    libc = ctypes.CDLL(None)
    libc.getauxval.restype, libc.getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    h = libc.getauxval(16)  # AT_HWCAP
    return {"fphp": bool(h >> 9 & 1), "asimdhp": bool(h >> 10 & 1), "asimddp": bool(h >> 20 & 1), "sve": bool(h >> 22 & 1)}


def main(request: str) -> None:
    t0 = time.perf_counter()
    import numpy as np
    import torch
    from executorch.runtime import Runtime, Verification

    torch.set_num_threads(1)
    plan = json.load(open(os.path.join(request, "plan.json")))
    inputs = np.load(os.path.join(request, "inputs.npz"))
    report = {"machine": platform.machine(), "hwcaps": hwcaps(), "import_s": time.perf_counter() - t0, "jobs": {}}
    runtime, programs, outs = Runtime.get(), {}, {}
    for job in plan["jobs"]:
        if job["pte"] not in programs:  # held for the whole run: a method must not outlive its program
            programs[job["pte"]] = runtime.load_program(job["pte"], verification=Verification.Minimal)
        method = programs[job["pte"]].load_method(job["method"])
        prev, times = None, []
        for i, names in enumerate(job["calls"]):
            args = [torch.from_numpy(inputs[n]) for n in names]
            if job["stream"] and prev is not None:
                args = args[:1] + prev
            t = time.perf_counter()
            out = method.execute(args)
            times.append(time.perf_counter() - t)
            prev = [o.clone() for o in out[1:]]
            for k, o in enumerate(out):
                outs[f"{job['id']}/{i}/{k}"] = o.numpy().copy()
        report["jobs"][job["id"]] = times
    report["total_s"] = time.perf_counter() - t0
    for name, save in (("outputs.npz", lambda f: np.savez(f, **outs)),
                       ("report.json", lambda f: f.write(json.dumps(report).encode()))):
        tmp = os.path.join(request, name + ".tmp")
        with open(tmp, "wb") as f:
            save(f)
        os.replace(tmp, os.path.join(request, name))


def receive(fd: int):
    """One message from `fd` (8-byte little-endian length, then a torch.save); EOFError at its end or on a zero length."""
    import io
    import struct

    import torch

    def exactly(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)
    (n,) = struct.unpack("<Q", exactly(8))
    if n == 0:
        raise EOFError
    return torch.load(io.BytesIO(exactly(n)), weights_only=True)


def send(fd: int, obj) -> None:
    """One message to `fd`, as receive() reads it."""
    import io
    import struct

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    view = memoryview(struct.pack("<Q", len(buf.getvalue())) + buf.getvalue())
    while view:
        view = view[os.write(fd, view):]


def serve(fd_in: int, fd_out: int) -> None:
    import torch
    from executorch.runtime import Runtime, Verification

    torch.set_num_threads(1)
    runtime, programs, methods = Runtime.get(), {}, {}
    while True:
        try:
            req = receive(fd_in)
        except EOFError:
            return
        try:
            key = (req["pte"], req["method"])
            if key not in methods:
                if req["pte"] not in programs:  # held while its methods live
                    programs[req["pte"]] = runtime.load_program(req["pte"], verification=Verification.Minimal)
                methods[key] = programs[req["pte"]].load_method(req["method"])
            send(fd_out, {"outputs": [o.clone() for o in methods[key].execute(req["inputs"])]})
        except Exception as e:  # noqa: BLE001 -- the host raises it, naming the CPU
            send(fd_out, {"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main(sys.argv[1])
