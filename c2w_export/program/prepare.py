"""Export preparation: what is constant at inference is computed once into buffers, so an exported
graph does not recompute it on every call (fewer nodes: faster lowering, fewer ops outside the
delegate). The prepared decoder is what gets exported; builds still compare every stage with the
untouched decoder (and the tests with upstream), so a folding bug cannot hide.

- SnakeBeta: exp(alpha) and 1/(exp(beta) + 1e-9) as buffers (FoldedSnake).
- Split RVQ: each half's codebooks as one stacked table embedding_sum / usage.clamp, looked up once
  with per-codebook offsets (FoldedRVQ).
- Transposed convs: as the stride-1 conv of their output phases, interleaved
  (conv_transpose1d_by_phases: XNNPACK's transposed conv runs at ~half its conv's speed); the bias
  as a [1, C, 1] buffer (no per-call unsqueeze).
- RoPE: the inverse frequencies as a buffer.
- RMSNorm and the ConvNeXt LayerNorm: the mean over channels written as a 4-D global average
  (`mean_last`), the form XNNPACK delegates, so the norms stop splitting the graph into partitions.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.decoder import Code2Wav, ResidualVQ, Transformer
from ..model.layers import CausalConvTranspose1d, RMSNorm, SnakeBeta, snake, snake_constants


def mean_last(x: Tensor) -> Tensor:
    """Mean over the last dim, [B, T, C] -> [B, T, 1], as a global average over the inner two dims
    of a 4-D view (XNNPACK delegates mean.dim only in that form)."""
    b, t, c = x.shape
    return x.view(b, t, 1, c).mean((2, 3), keepdim=True).view(b, t, 1)


def rms_norm_4d(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """layers.rms_norm with the mean as mean_last. x [B, T, C]."""
    dtype = x.dtype
    h = x.to(torch.promote_types(dtype, torch.float32))
    return weight * (h * torch.rsqrt(mean_last(h.pow(2)) + eps)).to(dtype)


def layer_norm_4d(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """F.layer_norm over the last dim with both means as mean_last. x [B, T, C]."""
    centered = x - mean_last(x)
    return centered * torch.rsqrt(mean_last(centered.pow(2)) + eps) * weight + bias


class FoldedSnake(SnakeBeta):
    """SnakeBeta with its constants precomputed (still a SnakeBeta to the decoder, which calls it
    without state). [B, C, T] -> [B, C, T]."""

    def __init__(self, module: SnakeBeta):
        nn.Module.__init__(self)
        alpha, inv_beta = snake_constants(module.alpha.detach(), module.beta.detach())
        self.register_buffer("alpha", alpha)
        self.register_buffer("inv_beta", inv_beta)

    def forward(self, x: Tensor) -> Tensor:
        return snake(x, self.alpha, self.inv_beta)


class FoldedRVQ(nn.Module):
    """ResidualVQ with its n codebooks stacked into one table [n * size, dim]: codes [B, n, T] ->
    [B, codebook_dim, T]."""

    def __init__(self, module: ResidualVQ):
        super().__init__()
        tables = [vq._codebook.embedding().detach() for vq in module.vq.layers]
        size = tables[0].shape[0]
        self.register_buffer("table", torch.cat(tables))
        self.register_buffer("offsets", (torch.arange(len(tables), dtype=torch.int64) * size)[None, :, None])
        self.output_proj = module.output_proj

    def forward(self, codes: Tensor) -> Tensor:
        summed = F.embedding(codes + self.offsets, self.table).sum(1)  # [B, T, dim]
        return self.output_proj(summed.transpose(1, 2))


def phase_weight(weight: Tensor, stride: int) -> Tensor:
    """A transposed conv's weight [Cin, Cout, K] (stride S) -> the weight [Cout * S, Cin, taps] of
    the stride-1 conv that computes its S output phases, taps = ceil(K / S): output channel
    c * S + j, tap k holds weight[:, c, j + S * (taps - 1 - k)] (zero past K)."""
    cin, cout, kernel = weight.shape
    taps = -(-kernel // stride)
    w = F.pad(weight, (0, taps * stride - kernel)).view(cin, cout, taps, stride).flip(2)  # [Cin, Cout, tap, phase]
    return w.permute(1, 3, 0, 2).reshape(cout * stride, cin, taps).contiguous()


def conv_transpose1d_by_phases(x: Tensor, phases: Tensor, stride: int, kernel: int) -> Tensor:
    """F.conv_transpose1d(x, weight, stride=S) without bias, computed as the stride-1 conv of
    phase_weight(weight, S) (one output channel per phase) and the phases interleaved in time.
    XNNPACK runs this conv 1.6-3.7x faster than its transposed conv (Subconv2D) at real-size shapes.
    x [B, Cin, T], phases [Cout * S, Cin, taps] -> [B, Cout, (T-1)*S + K]."""
    b, _, t = x.shape
    taps = phases.shape[-1]
    y = F.conv1d(x, phases, padding=taps - 1)  # [B, Cout * S, T + taps - 1]: out[S*t + j] = y[c*S + j, t]
    full = y.view(b, -1, stride, t + taps - 1).transpose(2, 3).reshape(b, -1, (t + taps - 1) * stride)
    n = (t - 1) * stride + kernel
    return full[..., :n] if full.shape[-1] > n else full  # a kernel short of taps * S ends earlier


class FoldedConvTranspose1d(CausalConvTranspose1d):
    """CausalConvTranspose1d computed by conv_transpose1d_by_phases, its bias a [1, Cout, 1] buffer
    (layers.overlap_add takes either shape). The transposed conv's weight is dropped; `conv` stays
    for its shape (state_shapes, the decoder's reach)."""

    def __init__(self, module: CausalConvTranspose1d):  # module belongs to prepare()'s private copy
        nn.Module.__init__(self)
        self.conv, self.overlap, self.state_name = module.conv, module.overlap, module.state_name
        bias = module.conv.bias
        self.register_buffer("bias3", None if bias is None else bias.detach()[None, :, None])
        self.phases = nn.Parameter(phase_weight(module.conv.weight.detach(), module.conv.stride[0]))
        self.conv.weight, self.conv.bias = None, None  # carried by phases and bias3 alone

    def forward(self, x: Tensor, state, keep: Tensor | None = None):
        return self._forward(x, state, self.bias3, keep)

    def _full(self, x: Tensor) -> Tensor:
        return conv_transpose1d_by_phases(x, self.phases, self.conv.stride[0], self.conv.kernel_size[0])


class RMSNorm4D(RMSNorm):
    def __init__(self, module: RMSNorm):
        nn.Module.__init__(self)
        self.weight, self.eps = module.weight, module.eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm_4d(x, self.weight, self.eps)


class LayerNorm4D(nn.Module):
    def __init__(self, module: nn.LayerNorm):
        super().__init__()
        self.weight, self.bias, self.eps = module.weight, module.bias, module.eps

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm_4d(x, self.weight, self.bias, self.eps)


class FoldedTransformer(Transformer):
    """Transformer whose RoPE inverse frequencies are a buffer, computed by the same function."""

    KEEP_FP32 = ("inv_freq_table",)  # precision.to_half: positions * inv_freq stay float32, as unfolded

    def __init__(self, module: Transformer):
        nn.Module.__init__(self)
        self.input_proj, self.layers, self.norm, self.output_proj = (
            module.input_proj, module.layers, module.norm, module.output_proj)
        self.head_dim, self.theta, self.cache, self.window = module.head_dim, module.theta, module.cache, module.window
        self.register_buffer("inv_freq_table", module.inv_freq(module.input_proj.weight.dtype))

    def inv_freq(self, dtype: torch.dtype) -> Tensor:
        return self.inv_freq_table


# module type -> its export-ready replacement
FOLDS: dict[type, type] = {
    SnakeBeta: FoldedSnake, ResidualVQ: FoldedRVQ, CausalConvTranspose1d: FoldedConvTranspose1d,
    RMSNorm: RMSNorm4D, nn.LayerNorm: LayerNorm4D, Transformer: FoldedTransformer,
}  # module type -> its folded replacement


def prepare(decoder: Code2Wav) -> Code2Wav:
    """A copy of `decoder` with every FOLDS module replaced (the original is untouched)."""
    prepared = copy.deepcopy(decoder)
    for name, module in list(prepared.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) in FOLDS:
                setattr(module, child_name, FOLDS[type(child)](child))
    return prepared.eval().requires_grad_(False)
