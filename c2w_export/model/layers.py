"""Leaf layers of Code2Wav: the math as pure functions, the modules as thin parameter holders.

A stateful leaf (`StatefulLeaf`) takes the whole state mapping and returns the new tensors for its
own names: `forward(x, state) -> (y, {name: new tensor})` for convs, with extra inputs first for
attention (`forward(x, cos, sin, bias, state)`). Nothing is mutated in place. A leaf whose names
are absent from the state decodes a stream start without state (the offline decode): zero
left padding for convs, nothing carried for transposed convs, no cached keys for attention. It
equals one streaming step from the zero initial state: a causal conv's zero history is exactly
the zero left padding, and zero keys at negative positions are masked out.

A window whose first frames are absent history (the windowed program at a stream start) passes
`keep`, float [1, 1, T] per code frame (0: absent): every conv and transposed conv with a reach
across frames zeroes the absent samples of its input, which is exactly the causal zero padding the
offline decode sees before frame 0.
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

State = Mapping[str, Tensor]
Tail = Callable[[Tensor, int], Tensor]  # (x [..., L], n) -> x's last n samples [..., n]


# ---------------------------------------------------------------- pure functions
def snake_constants(log_alpha: Tensor, log_beta: Tensor) -> tuple[Tensor, Tensor]:
    """SnakeBeta's per-channel constants from the stored logs [C] -> alpha, 1/(beta + 1e-9), [1, C, 1]."""
    return torch.exp(log_alpha)[None, :, None], 1.0 / (torch.exp(log_beta)[None, :, None] + 1e-9)


def snake(x: Tensor, alpha: Tensor, inv_beta: Tensor) -> Tensor:
    """x + inv_beta * sin^2(alpha x). x [B, C, T], alpha / inv_beta [1, C, 1]."""
    return x + inv_beta * torch.sin(x * alpha).pow(2)


def snake_beta(x: Tensor, log_alpha: Tensor, log_beta: Tensor) -> Tensor:
    """SnakeBeta: x + 1/beta * sin^2(alpha x), alpha and beta stored as logs. x [B, C, T]."""
    return snake(x, *snake_constants(log_alpha, log_beta))


def cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x in `dtype`; x itself where it already is (a same-dtype .to() can still trace graph nodes)."""
    return x if x.dtype == dtype else x.to(dtype)


def work_dtype(dtype: torch.dtype, upcast: bool = True) -> torch.dtype:
    """The dtype a norm's statistics or a softmax compute in: at least float32 (`upcast`), or the
    input's own (a mixed-precision decoder's float16 transformer: a cast is never delegated by
    XNNPACK, so each one would split the layer's partition)."""
    return torch.promote_types(dtype, torch.float32) if upcast else dtype


def rms_norm(x: Tensor, weight: Tensor, eps: float, upcast: bool = True) -> Tensor:
    """RMSNorm over the last dim, computed in work_dtype(x.dtype, upcast)."""
    h = cast(x, work_dtype(x.dtype, upcast))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * cast(h, x.dtype)


def rope_inv_freq(head_dim: int, theta: float, dtype: torch.dtype) -> Tensor:
    """Default RoPE inverse frequencies, each repeated for both halves: [head_dim], in >= float32."""
    work = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(work) / head_dim))
    return torch.cat((inv_freq, inv_freq))


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """RoPE tables for int positions [T] and rope_inv_freq [D] -> cos, sin [T, D] in `dtype`."""
    emb = positions.to(inv_freq.dtype)[:, None] * inv_freq
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, D] rotated by cos/sin [T, D] (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def sliding_window_mask(q_pos: Tensor, k_pos: Tensor, window: int) -> Tensor:
    """Bool [Tq, Tk]: key exists (pos >= 0), is not in the future, and is within `window` frames
    including the query itself (q - k < window)."""
    delta = q_pos[:, None] - k_pos  # [Tq, Tk] by broadcasting
    return (k_pos >= 0) & (delta >= 0) & (delta < window)


def mask_bias(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """Bool [Tq, Tk] -> additive mask [Tq, Tk]: 0 where allowed, the dtype's lowest value elsewhere.

    Not -inf: every query sees at least itself, and a finite fill keeps partitioners away from inf
    arithmetic. Computed once per step, so the per-layer graph holds only an add."""
    return torch.where(allowed, torch.zeros((), dtype=dtype), torch.full((), torch.finfo(dtype).min, dtype=dtype))


def group_bias(bias: Tensor, groups: int) -> Tensor:
    """mask_bias [Tq, Tk] -> [G * Tq, Tk], the rows of `attention`'s folded query heads: G copies
    stacked (a cat: XNNPACK delegates it at a dynamic Tq, where a repeat or a view over the
    groups would run outside the delegate)."""
    return torch.cat([bias] * groups) if groups > 1 else bias


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float, upcast: bool = True) -> Tensor:
    """q [B, H, Tq, D], k/v [B, Hkv, Tk, D], bias [G * Tq, Tk] (group_bias of mask_bias, G = H / Hkv)
    -> [B, H, Tq, D].

    Grouped-query attention without copying K/V per head: the H = Hkv * G query heads are folded
    into [B * Hkv, G * Tq, D], head h reading kv head h // G. Softmax in work_dtype(q.dtype, upcast). The views
    infer the frame axis (-1) of contiguous tensors: export keeps that -1 (a reshape of a
    transposed tensor is traced with the size computed), and XNNPACK delegates a reshape with one
    inferred size, not one with a symbolic size (a dynamic chunk)."""
    b, h, _, d = q.shape
    kv = k.shape[1]
    q = q.contiguous().view(b * kv, -1, d)  # 3-D batched matmuls: no broadcasting expands in the graph
    k, v = k.contiguous().view(b * kv, -1, d), v.contiguous().view(b * kv, -1, d)
    scores = torch.bmm(q, k.transpose(1, 2)) * scale + bias  # [B * Hkv, G * Tq, Tk]
    weights = cast(torch.softmax(cast(scores, work_dtype(q.dtype, upcast)), dim=-1), q.dtype)
    return torch.bmm(weights, v).view(b, h, -1, d)


def last_samples(x: Tensor, n: int) -> Tensor:
    """x [..., L] -> its last n samples [..., n] (a slice)."""
    return x[..., x.shape[-1] - n:]


def causal_conv1d(x: Tensor, history: Tensor | None, weight: Tensor, bias: Tensor | None,
                  dilation: int, groups: int, tail: Tail = last_samples) -> tuple[Tensor, Tensor]:
    """Stride-1 causal conv. x [B, Cin, T], history [B, Cin, P] with P = (K-1)*dilation, or None
    for a stream start (zero left padding) -> y [B, Cout, T], new history [B, Cin, P] (the last P
    input samples seen, taken by `tail`)."""
    pad = (weight.shape[-1] - 1) * dilation
    xx = torch.cat([history, x], dim=-1) if history is not None else F.pad(x, (pad, 0))
    y = F.conv1d(xx, weight, bias, dilation=dilation, groups=groups)
    return y, tail(xx, pad)


def transposed_history(kernel: int, stride: int) -> int:
    """Input frames before a chunk that a causal transposed conv (kernel K, stride S) still needs:
    ceil(K/S) - 1 (1 for S < K <= 2S, 0 for K == S)."""
    return -(-kernel // stride) - 1


def causal_conv_transpose1d(x: Tensor, history: Tensor | None, weight: Tensor, bias: Tensor | None,
                            stride: int, tail: Tail = last_samples) -> tuple[Tensor, Tensor]:
    """Causal transposed conv: its output samples T*S of x, the last K-S of the full transposed conv
    trimmed (they belong to the next chunk). x [B, Cin, T], weight [Cin, Cout, K], history
    [B, Cin, H] (H = transposed_history(K, S): the input frames before x whose kernels reach into
    x's samples; None: a stream start, zero frames) -> y [B, Cout, T*S], new history [B, Cin, H]."""
    h = transposed_history(weight.shape[-1], stride)
    n = x.shape[-1] * stride
    if history is None:  # offline: nothing before x; the full transposed conv with its tail trimmed
        full = F.conv_transpose1d(x, weight, bias, stride=stride)
        return (full[..., :n] if full.shape[-1] > n else full), x[..., x.shape[-1] - h:]
    xx = torch.cat([history, x], dim=-1)
    y = F.conv_transpose1d(xx, weight, bias, stride=stride)[..., h * stride: h * stride + n]
    return y, tail(xx, h)


def compute_dtype(module: nn.Module) -> torch.dtype | None:
    """The float dtype `module` computes in: that of its first floating parameter or buffer (None:
    it holds none, and computes in its input's). A mixed-precision decoder (float32 parts in a
    float16 one, program/precision.py) has more than one."""
    for t in itertools.chain(module.parameters(), module.buffers()):  # stops at the first
        if t.is_floating_point():
            return t.dtype
    return None


def into(x: Tensor, module: nn.Module) -> Tensor:
    """x cast to the dtype `module` computes in; x itself where it already is (no graph node), so a
    decoder of one dtype traces no cast."""
    dtype = compute_dtype(module)
    return x if dtype is None else cast(x, dtype)


def drop_absent(x: Tensor, keep: Tensor | None) -> Tensor:
    """x [B, C, n] with the samples of absent frames zeroed (keep [1, 1, T] with n = T * rate, or
    None: all frames present). A broadcast multiply over the view [B, C, T, rate]: no per-sample
    mask is materialized (an expand_copy each, which runs outside the XNNPACK delegate). The
    reshapes name the frame axis -1: XNNPACK delegates a reshape with one inferred size, not one
    with a symbolic size (a dynamic chunk)."""
    if keep is None:
        return x
    keep = cast(keep, x.dtype)  # a mixed-precision decoder: in the dtype of the part it masks
    b, c, n = x.shape
    t = keep.shape[-1]
    if n == t:
        return x * keep
    return (x.reshape(b, c, -1, n // t) * keep[..., None]).reshape(b, c, -1)


# ---------------------------------------------------------------- thin modules
class SnakeBeta(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))  # log alpha
        self.beta = nn.Parameter(torch.zeros(channels))  # log beta

    def forward(self, x: Tensor) -> Tensor:
        return snake_beta(x, self.alpha, self.beta)


class Trim(nn.Module):
    """x [B, C, n] -> x[..., k:] [B, C, n - k]: its first k samples (static) dropped."""

    def forward(self, x: Tensor, k: int) -> Tensor:
        return x.narrow(-1, k, x.shape[-1] - k)  # narrow, not x[..., k:]: no clamp of k to n to reason about


class StatefulLeaf(nn.Module):
    """A leaf with named state. `state_name` is its module path, set by the decoder."""

    state_name: str = ""
    rate: int = 1  # samples per code frame of its input (Code2Wav.leaf_rates), set by the decoder

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """{state name: shape without the batch dim}."""
        raise NotImplementedError

    def tail(self, x: Tensor, n: int) -> Tensor:
        """x [B, C, L] -> its last n samples [B, C, n], the new history (a slice; an export folds it
        into what its backend delegates, program/prepare.py)."""
        return last_samples(x, n)


class CausalConv1d(StatefulLeaf):
    """Checkpoint layout `<name>.conv.{weight,bias}`. State `<name>.history`: [B, Cin, (K-1)*dilation]."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.pad = (kernel - 1) * dilation

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"{self.state_name}.history": (self.conv.in_channels, self.pad)} if self.pad else {}

    def forward(self, x: Tensor, state: State, keep: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """x [B, Cin, T*rate]; keep [1, 1, T] (absent frames) or None -> [B, Cout, T*rate]."""
        if not self.pad:  # a 1x1 conv has no history
            return self.conv(x), {}
        key = f"{self.state_name}.history"
        y, hist = causal_conv1d(drop_absent(x, keep), state.get(key), self.conv.weight, self.conv.bias,
                                self.conv.dilation[0], self.conv.groups, self.tail)
        return y, ({key: hist} if key in state else {})


class CausalConvTranspose1d(StatefulLeaf):
    """Checkpoint layout `<name>.conv.{weight,bias}`. State `<name>.history`: [B, Cin, H], the last
    H = ceil(K/S) - 1 input frames (their kernels overlap the next chunk's first samples)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        if not (kernel == stride or stride < kernel <= 2 * stride):
            raise ValueError(f"transposed conv needs kernel == stride or stride < kernel <= 2*stride, got {kernel}, {stride}")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.overlap = kernel - stride
        self.pad = transposed_history(kernel, stride)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"{self.state_name}.history": (self.conv.in_channels, self.pad)} if self.pad else {}

    def forward(self, x: Tensor, state: State, keep: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """x [B, Cin, T*rate]; keep [1, 1, T] or None -> [B, Cout, T*rate*stride]."""
        key = f"{self.state_name}.history"
        if self.pad:  # only an overlapping kernel carries an absent frame into a present one
            x = drop_absent(x, keep)
        y, hist = self._conv(x, state.get(key))
        return y, ({key: hist} if key in state else {})

    def _conv(self, x: Tensor, history: Tensor | None) -> tuple[Tensor, Tensor]:
        """causal_conv_transpose1d with this module's weights -> (y, new history)."""
        return causal_conv_transpose1d(x, history, self.conv.weight, self.conv.bias, self.conv.stride[0], self.tail)


class RMSNorm(nn.Module):
    upcast = True  # statistics in at least float32 (layers.work_dtype)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, self.upcast)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x
