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

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

State = Mapping[str, Tensor]


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


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim, computed in at least float32."""
    dtype = x.dtype
    h = x.to(torch.promote_types(dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


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


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
    """q [B, H, Tq, D], k/v [B, Hkv, Tk, D], bias [Tq, Tk] (mask_bias) -> [B, H, Tq, D].

    Grouped-query attention without copying K/V per head: the H = Hkv * G query heads are folded
    into [B * Hkv, G * Tq, D], head h reading kv head h // G. Softmax in >= float32."""
    b, h, tq, d = q.shape
    kv = k.shape[1]
    groups = h // kv
    q = q.reshape(b * kv, groups * tq, d)  # 3-D batched matmuls: no broadcasting expands in the graph
    k, v = k.reshape(b * kv, -1, d), v.reshape(b * kv, -1, d)
    scores = torch.bmm(q, k.transpose(1, 2)) * scale  # [B * Hkv, G * Tq, Tk]
    tk = scores.shape[-1]
    # the mask broadcast over the G heads of a view (a repeat would run outside the XNNPACK delegate)
    scores = scores + bias if groups == 1 else (scores.view(b * kv, groups, tq, tk) + bias).view(b * kv, groups * tq, tk)
    weights = torch.softmax(scores.to(torch.promote_types(q.dtype, torch.float32)), dim=-1).to(q.dtype)
    return torch.bmm(weights, v).reshape(b, h, tq, d)


def causal_conv1d(x: Tensor, history: Tensor | None, weight: Tensor, bias: Tensor | None,
                  dilation: int, groups: int) -> tuple[Tensor, Tensor]:
    """Stride-1 causal conv. x [B, Cin, T], history [B, Cin, P] with P = (K-1)*dilation, or None
    for a stream start (zero left padding) -> y [B, Cout, T], new history [B, Cin, P] (the last P
    input samples seen)."""
    pad = (weight.shape[-1] - 1) * dilation
    xx = torch.cat([history, x], dim=-1) if history is not None else F.pad(x, (pad, 0))
    y = F.conv1d(xx, weight, bias, dilation=dilation, groups=groups)
    return y, xx[..., xx.shape[-1] - pad:]


def overlap_add(full: Tensor, carry: Tensor | None, bias: Tensor | None, n: int) -> tuple[Tensor, Tensor]:
    """Causal transposed conv (kernel K with S < K <= 2S or K == S) from its full output.

    full [B, Cout, (T-1)*S + K] (the transposed conv of x [B, Cin, T], bias not added), carry
    [B, Cout, K-S] (the previous chunk's overlap tail, bias taken out; None at a stream start:
    nothing to add), bias [Cout] or [1, Cout, 1], n = T*S -> y [B, Cout, n] (carry added to its
    head, then the bias), new carry full[..., n:] [B, Cout, K-S]. Offline this is the full
    transposed conv with its last K-S samples trimmed."""
    overlap = carry.shape[-1] if carry is not None else 0
    if overlap:
        y = torch.cat([full[..., :overlap] + carry, full[..., overlap:n]], dim=-1)
    else:
        y = full[..., :n] if full.shape[-1] > n else full  # K == S: nothing to trim
    if bias is not None:
        y = y + (bias if bias.dim() == 3 else bias[None, :, None])
    return y, full[..., n:]


def drop_absent(x: Tensor, keep: Tensor | None) -> Tensor:
    """x [B, C, n] with the samples of absent frames zeroed (keep [1, 1, T] with n = T * rate, or
    None: all frames present). A broadcast multiply over the view [B, C, T, rate]: no per-sample
    mask is materialized (an expand_copy each, which runs outside the XNNPACK delegate)."""
    if keep is None:
        return x
    b, c, n = x.shape
    t = keep.shape[-1]
    if n == t:
        return x * keep
    return (x.reshape(b, c, t, n // t) * keep[..., None]).reshape(b, c, n)


def last_frames(x: Tensor, keep: Tensor | None, total: int, frames: int) -> tuple[Tensor, Tensor | None]:
    """x [B, C, total * rate] -> its last `frames` code frames [B, C, frames * rate], with keep
    [1, 1, total] or None cut the same way. Static slices: the frame counts are fixed at export."""
    if frames >= total:
        return x, keep
    rate = x.shape[-1] // total
    return x[..., (total - frames) * rate:], (keep[..., total - frames:] if keep is not None else None)


# ---------------------------------------------------------------- thin modules
class SnakeBeta(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))  # log alpha
        self.beta = nn.Parameter(torch.zeros(channels))  # log beta

    def forward(self, x: Tensor) -> Tensor:
        return snake_beta(x, self.alpha, self.beta)


class StatefulLeaf(nn.Module):
    """A leaf with named state. `state_name` is its module path, set by the decoder."""

    state_name: str = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """{state name: shape without the batch dim}."""
        raise NotImplementedError


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
                                self.conv.dilation[0], self.conv.groups)
        return y, ({key: hist} if key in state else {})


class CausalConvTranspose1d(StatefulLeaf):
    """Checkpoint layout `<name>.conv.{weight,bias}`. State `<name>.carry`: [B, Cout, K-S]."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        if not (kernel == stride or stride < kernel <= 2 * stride):
            raise ValueError(f"transposed conv needs kernel == stride or stride < kernel <= 2*stride, got {kernel}, {stride}")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.overlap = kernel - stride

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"{self.state_name}.carry": (self.conv.out_channels, self.overlap)} if self.overlap else {}

    def forward(self, x: Tensor, state: State, keep: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """x [B, Cin, T*rate]; keep [1, 1, T] or None -> [B, Cout, T*rate*stride]."""
        return self._forward(x, state, self.conv.bias, keep)

    def _forward(self, x: Tensor, state: State, bias: Tensor | None,
                 keep: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        key = f"{self.state_name}.carry"
        if self.overlap:  # only an overlapping kernel carries an absent frame into a present one
            x = drop_absent(x, keep)
        y, new_carry = overlap_add(self._full(x), state.get(key), bias, x.shape[-1] * self.conv.stride[0])
        return y, ({key: new_carry} if key in state else {})

    def _full(self, x: Tensor) -> Tensor:
        """x [B, Cin, T] -> the full transposed conv without bias [B, Cout, (T-1)*S + K]."""
        return F.conv_transpose1d(x, self.conv.weight, None, stride=self.conv.stride[0])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x
