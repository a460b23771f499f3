"""The machine's fp32 GEMM peak, measured in the run whose achieved GFLOP/s it puts in scale: one
large matmul through PyTorch (eager's kernels) and through the ExecuTorch XNNPACK runtime (the
shipped programs' kernels). Absolute GFLOP/s differ between machines; a share of the peak
measured in the same run does not depend on which machine ran it."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

N = 1024  # [N, N] @ [N, N]: 2.1 GFLOP per call, large enough for every kernel's steady state
ROUNDS = 9


class _MatMul(torch.nn.Module):
    """x [N, N] -> x @ w, w a constant [N, N] (a weight, as the decoder's GEMMs have)."""

    def __init__(self, n: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, n, generator=torch.Generator().manual_seed(0)) / n ** 0.5)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.w)


def _median_seconds(call: Callable[[], object], rounds: int) -> float:
    call()  # warm-up: packing, first-touch
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def gemm_peak(runtime: str, n: int = N, rounds: int = ROUNDS) -> dict:
    """GFLOP/s of one [n, n] @ [n, n] fp32 matmul, median of `rounds` calls after a warm-up.
    runtime: "torch" (torch.nn.functional.linear) or "xnnpack" (the module exported, lowered to
    XNNPACK and run in the ExecuTorch runtime) -> {"runtime", "n", "gflop_s", "median_ms"}."""
    module = _MatMul(n).eval()
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(1))
    if runtime == "torch":
        with torch.no_grad():
            seconds = _median_seconds(lambda: module(x), rounds)
    elif runtime == "xnnpack":
        from ..program.flows import ExecuTorchLoaded
        from ..program.lowering import lower_together

        ep = torch.export.export(module, (x,))
        loaded = ExecuTorchLoaded(lower_together({"forward": ep}, "xnnpack").to_executorch().buffer)
        out = loaded.run("forward", [x])[0]
        with torch.no_grad():  # the lowered GEMM must compute the matmul, or its speed means nothing
            err = (out - module(x)).abs().max().item()
        if err > 1e-3:
            raise RuntimeError(f"the XNNPACK peak program is wrong (max abs {err:g} against torch)")
        seconds = _median_seconds(lambda: loaded.run("forward", [x]), rounds)
    else:
        raise ValueError(f"unknown runtime {runtime!r}; have 'torch', 'xnnpack'")
    return {"runtime": runtime, "n": n, "gflop_s": 2 * n ** 3 / seconds / 1e9, "median_ms": seconds * 1e3}
