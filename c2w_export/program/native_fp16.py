"""Eager emulation of native half-precision arithmetic: how a phone (ARMv8.2 FP16) or an x86 CPU
with AVX512-FP16 computes an fp16 program through XNNPACK.

There XNNPACK's f16 GEMM and convolution kernels keep their accumulators in fp16: the accumulator
starts at the bias and takes one fused multiply-add per reduction step (taps, then channels), rounded
to fp16 each time. Its depthwise kernels round after every tap on every CPU. PyTorch's CPU half
kernels (the fp16 own reference) accumulate in float32 and round once per op, and so does XNNPACK's
GEMM on a CPU without half arithmetic (F16C converts to float32). So on such a CPU the phone's
arithmetic is only seen through this emulation.

Inside `NativeFp16()`, every float16 `linear`, `conv1d` (depthwise too) and `bmm` accumulates in fp16,
one step at a time. Other ops run as PyTorch runs them: XNNPACK's binary elementwise ops round once
per op on both kinds of CPU, its sums, means and softmax sums accumulate in float32 on both, and the
decoder's RMSNorm statistics are float32 in the fp16 program anyway. Not emulated: the fp16
polynomials native CPUs use for exp, tanh, GELU and sin (a few ulps per element, not accumulated).
A Python loop over the reduction axis: fast on the tiny checkpoints, slow at real size (measured
in the frontier report). Kernel choices: XNNPACK src/configs/gemm-config.c, dwconv-config.c, reduce-config.c.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode


def accumulate(a: Tensor, b: Tensor, init: Tensor) -> Tensor:
    """fp16 sum over k of a[..., k, None] * b[..., k, :], started at `init`, rounded to fp16 after
    every step (a fused multiply-add into an fp16 accumulator, as XNNPACK's avx512fp16 and neonfp16arith
GEMM kernels do: bias first, then k in order, no split of K). a [..., N, K], b [..., K, M] (either
    broadcast over the leading dims), init broadcastable to [..., N, M] -> float16 [..., N, M]."""
    shape = torch.broadcast_shapes(a.shape[:-1] + b.shape[-1:], init.shape)
    acc = init.to(torch.float16).expand(shape).clone()
    a, b = a.half(), b.half()
    for k in range(a.shape[-1]):
        # PyTorch's half addcmul computes in float32, where an fp16 product is exact, and rounds to fp16
        # once: the FMA's result but for rare double rounding (0 of 81,920 sums of 300 differed from a
        # float64 scalar FMA loop); 6-13x faster than converting every step
        acc.addcmul_(a[..., k, None], b[..., k, None, :])
    return acc


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear with fp16 accumulation. x [..., K], weight [M, K], bias [M] -> [..., M]."""
    init = bias if bias is not None else x.new_zeros(weight.shape[0])
    return accumulate(x, weight.t(), init)


def conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """F.conv1d with fp16 accumulation, reduced tap by tap and within a tap channel by channel, as
    XNNPACK's indirect GEMM walks its kernel. x [B, Cin, T], weight [Cout, Cin/groups, kw], bias [Cout]
    -> [B, Cout, T_out]."""
    stride, padding, dilation = (v[0] if isinstance(v, (tuple, list)) else v for v in (stride, padding, dilation))
    if isinstance(padding, str):
        raise NotImplementedError("native fp16 emulation: string padding")
    x = F.pad(x, (padding, padding))
    b, cin, t = x.shape
    cout, cin_g, kw = weight.shape
    t_out = (t - dilation * (kw - 1) - 1) // stride + 1
    taps = torch.stack([x[..., j * dilation: j * dilation + stride * (t_out - 1) + 1: stride] for j in range(kw)], -1)
    cols = taps.view(b, groups, cin_g, t_out, kw).permute(0, 1, 3, 4, 2).reshape(b, groups, t_out, kw * cin_g)
    w = weight.view(groups, cout // groups, cin_g, kw).permute(0, 3, 2, 1).reshape(groups, kw * cin_g, cout // groups)
    init = (bias if bias is not None else x.new_zeros(cout)).view(groups, 1, cout // groups)
    y = accumulate(cols, w, init)  # [B, G, T_out, Cout/G]
    return y.permute(0, 1, 3, 2).reshape(b, cout, t_out)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """torch.bmm with fp16 accumulation. a [B, N, K], b [B, K, M] -> [B, N, M]."""
    return accumulate(a, b, a.new_zeros(()))


EMULATED = {F.linear: linear, torch.conv1d: conv1d, F.conv1d: conv1d, torch.bmm: bmm}


class NativeFp16(TorchFunctionMode):
    """Within it, float16 linear / conv1d / bmm accumulate in fp16 (module docstring); float32 calls
    are untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        emulated = EMULATED.get(func)
        if emulated is not None and isinstance(args[0], Tensor) and args[0].dtype == torch.float16:
            with torch._C.DisableTorchFunction():
                return emulated(*args, **kwargs)
        return func(*args, **kwargs)


def emulated(module):
    """A RunFn (method, inputs) -> outputs that calls the float16 eager `module` (a variant module, any
    method name) under NativeFp16."""

    def run(method, inputs):
        with NativeFp16(), torch.no_grad():
            out = module(*inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return run
