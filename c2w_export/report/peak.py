"""The machine's fp32 GEMM peak, measured in the run whose achieved GFLOP/s it puts in scale: one
large matmul through PyTorch (eager's kernels) and through the ExecuTorch XNNPACK runtime (the
shipped programs' kernels). Absolute GFLOP/s differ between machines; a share of the peak
measured in the same run does not depend on which machine ran it."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

# [n, n] @ [n, n] at each size (0.27-17 GFLOP per call). The peak is the best size's fastest call:
# on these shared 2-core VMs one size's median moved +-25% between runs, and which size runs fastest
# differs by runtime (measured: XNNPACK 96-133 GFLOP/s at 1024, 201-205 at 2048; torch 144-200 at 512-2048).
SIZES = (512, 1024, 2048)
ROUNDS = 5
RUNTIMES = ("torch", "xnnpack")


class _MatMul(torch.nn.Module):
    """x [N, N] -> x @ w, w a constant [N, N] (a weight, as the decoder's GEMMs have)."""

    def __init__(self, n: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, n, generator=torch.Generator().manual_seed(0)) / n ** 0.5)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.w)


def _fastest_seconds(call: Callable[[], object], rounds: int) -> float:
    call()  # warm-up: packing, first-touch
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return min(times)


def gemm_peak(runtime: str, sizes: Sequence[int] = SIZES, rounds: int = ROUNDS) -> dict:
    """The fp32 GEMM peak through `runtime`: the best GFLOP/s over `sizes` of one [n, n] @ [n, n]
    matmul, each size's fastest of `rounds` calls after a warm-up. runtime: "torch"
    (torch.nn.functional.linear) or "xnnpack" (the module exported, lowered to XNNPACK and run in
    the ExecuTorch runtime) -> {"runtime", "n" (the best size), "gflop_s", "ms", "by_size" {n: GFLOP/s}}."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; have {', '.join(map(repr, RUNTIMES))}")
    by_size = {n: 2 * n ** 3 / _gemm_seconds(runtime, n, rounds) / 1e9 for n in sizes}
    best = max(by_size, key=by_size.get)
    return {"runtime": runtime, "n": best, "gflop_s": by_size[best], "ms": 2 * best ** 3 / by_size[best] / 1e6,
            "by_size": by_size}



def _gemm_seconds(runtime: str, n: int, rounds: int) -> float:
    """Fastest of `rounds` calls of one [n, n] @ [n, n] matmul through `runtime`."""
    module = _MatMul(n).eval()
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(1))
    if runtime == "torch":
        with torch.no_grad():
            return _fastest_seconds(lambda: module(x), rounds)
    if runtime == "xnnpack":
        from ..program.flows import ExecuTorchLoaded
        from ..program.lowering import lower_together

        ep = torch.export.export(module, (x,))
        loaded = ExecuTorchLoaded(lower_together({"forward": ep}, "xnnpack").to_executorch().buffer)
        out = loaded.run("forward", [x])[0]
        with torch.no_grad():  # the lowered GEMM must compute the matmul, or its speed means nothing
            err = (out - module(x)).abs().max().item()
        if err > 1e-3:
            raise RuntimeError(f"the XNNPACK peak program is wrong (max abs {err:g} against torch)")
        return _fastest_seconds(lambda: loaded.run("forward", [x]), rounds)
    raise ValueError(f"unknown runtime {runtime!r}; have {', '.join(map(repr, RUNTIMES))}")
