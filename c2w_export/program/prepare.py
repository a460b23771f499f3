"""Export preparation: what is constant at inference is computed once into buffers, so an exported
graph does not recompute it on every call (fewer nodes: faster lowering, fewer ops outside the
delegate). The prepared decoder is what gets exported; builds still compare every stage with the
untouched decoder (and the tests with upstream), so a folding bug cannot hide.

- SnakeBeta: exp(alpha) and 1/(exp(beta) + 1e-9) as buffers (FoldedSnake).
- Split RVQ: each half's codebooks as one stacked table embedding_sum / usage.clamp, looked up once
  with per-codebook offsets (FoldedRVQ).
- Transposed convs: as the stride-1 causal conv of their output phases, interleaved
  (causal_conv_transpose1d_by_phases: XNNPACK's transposed conv runs at ~half its conv's speed);
  the bias as a [1, C, 1] buffer (no per-call unsqueeze).
- RoPE: the inverse frequencies as a buffer; the rotate-half as a linear with a +-1 matrix
  (Rotate: exact, and delegated at a dynamic chunk, where slicing the halves is not).
- State updates (the last samples of a history, the last frames of a K/V cache): a batched matmul
  with a 0/1 selection (LastFrames: exact, and delegated at a dynamic chunk, where the slice is
  not: its input, the whole chunk, would leave the delegate and be planned at the largest chunk).
  The selection's zero block is built from one [T, 1] zeros per dtype, the only op left outside
  (share_factories makes the leaves share it).
- The windowed cuts (Trim): a dilated two-tap depthwise conv (ShiftTrim: exact, and delegated at
  a dynamic chunk, where the slice is not).
- SwiGLU's SiLU written as x * sigmoid(x) (SwiGLU4Export): the decomposition export applies to F.silu
  computes a float16 input in float32, and XNNPACK delegates neither cast; in float32 it is that
  same graph.
- RMSNorm and the ConvNeXt LayerNorm: the mean over channels written as a 4-D global average
  (`mean_last`), the form XNNPACK delegates, so the norms stop splitting the graph into partitions.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.decoder import MLP, Attention, Code2Wav, ResidualVQ, Transformer
from ..model.layers import (CausalConv1d, CausalConvTranspose1d, RMSNorm, SnakeBeta, Tail, Trim, cast, causal_conv1d,
                            into, last_samples, snake, snake_constants, work_dtype)


def mean_last(x: Tensor) -> Tensor:
    """Mean over the last dim, [B, T, C] -> [B, T, 1], as a global average over the inner two dims
    of a 4-D view (XNNPACK delegates mean.dim only in that form)."""
    b, _, c = x.shape  # the frame axis -1: a reshape with a symbolic size is not delegated
    return x.view(b, -1, 1, c).mean((2, 3), keepdim=True).view(b, -1, 1)


def rms_norm_4d(x: Tensor, weight: Tensor, eps: float, upcast: bool = True) -> Tensor:
    """layers.rms_norm with the mean as mean_last. x [B, T, C]."""
    h = cast(x, work_dtype(x.dtype, upcast))
    return weight * cast(h * torch.rsqrt(mean_last(h.pow(2)) + eps), x.dtype)


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
        return self.output_proj(into(summed.transpose(1, 2), self.output_proj))


def phase_weight(weight: Tensor, stride: int) -> Tensor:
    """A transposed conv's weight [Cin, Cout, K] (stride S) -> the weight [Cout * S, Cin, taps] of
    the stride-1 conv that computes its S output phases, taps = ceil(K / S): output channel
    c * S + j, tap k holds weight[:, c, j + S * (taps - 1 - k)] (zero past K)."""
    cin, cout, kernel = weight.shape
    taps = -(-kernel // stride)
    w = F.pad(weight, (0, taps * stride - kernel)).view(cin, cout, taps, stride).flip(2)  # [Cin, Cout, tap, phase]
    return w.permute(1, 3, 0, 2).reshape(cout * stride, cin, taps).contiguous()


def interleave_phases(y: Tensor, stride: int) -> Tensor:
    """[B, Cout * S, T] (channel c * S + j: output phase j of channel c) -> [B, Cout, T * S], the
    phases interleaved in time. The frame axis is -1 in both views: XNNPACK delegates a reshape
    with one inferred size, not one with a symbolic size (a dynamic chunk), and export keeps the -1
    of a view of a contiguous tensor (a reshape of a transposed one is traced with the size computed)."""
    b, channels, _ = y.shape
    return y.view(b, channels // stride, stride, -1).transpose(2, 3).contiguous().view(b, channels // stride, -1)


class LastFrames(nn.Module):
    """z [N, F, g] with F = m + T*k frames (T >= 1 the chunk, m and k static) -> its last m frames
    z[:, F - m:] [N, m, g], as a batched matmul with the 0/1 selection [F, m] (T*k zero rows, then
    the identity): each output is one input times 1 plus zeros, so it is exact in every float dtype
    (an inf or nan anywhere in z would spread, as 0 * inf is nan; a decoder's state holds neither).
    XNNPACK delegates the matmul, the permutes and the zero block's broadcast at a dynamic chunk;
    the [T, 1] zeros, built from T alone, is the one op outside, shared by every selection of a
    dtype (share_factories). Quantizers leave it alone (precision.EXACT_MODULES)."""

    def __init__(self, m: int, k: int):
        super().__init__()
        self.m, self.k = m, k
        self.register_buffer("eye", torch.eye(m))
        self.register_buffer("zero_row", torch.zeros(1, k * m))  # [T, 1] + this = the zero block's rows, k per frame

    def forward(self, z: Tensor) -> Tensor:
        n, f, g = z.shape
        zeros = torch.zeros((f - self.m) // self.k, 1, dtype=z.dtype)  # [T, 1]
        select = torch.cat([(zeros + self.zero_row).view(-1, self.m), self.eye])  # [F, m]
        flat = z.view(1, n, -1) if g == 1 else z.transpose(1, 2).contiguous().view(1, n * g, -1)  # [1, N*g, F]
        out = torch.bmm(flat, select.view(1, -1, self.m))  # [1, N*g, m]
        return out.view(n, self.m, 1) if g == 1 else out.view(n, g, self.m).transpose(1, 2)


def sample_frames(history: int, rate: int) -> LastFrames:
    """The LastFrames that keeps the last `history` samples of [C, history + T*rate]: frames of
    g = gcd(history, rate) samples, m = history / g of them kept, k = rate / g per code frame (g = 1
    at rate 1: a plain [L, history] selection; larger g: fewer columns, so fewer multiplies)."""
    g = math.gcd(history, rate)
    return LastFrames(history // g, rate // g)


def tail_by_frames(frames: LastFrames | None, x: Tensor, n: int) -> Tensor:
    """x [1, C, n + T*rate] -> its last n samples [1, C, n], by `frames` (sample_frames(n, rate);
    None: a leaf without history, n = 0)."""
    if frames is None:
        return last_samples(x, n)
    c = x.shape[1]
    return frames(x.view(c, -1, n // frames.m)).contiguous().view(1, c, n)


class TailByFrames:
    """A folded conv leaf's new history taken by its `frames` (sample_frames of its pad and rate)."""

    frames: LastFrames | None

    def fold_tail(self) -> None:
        self.frames = sample_frames(self.pad, self.rate) if self.pad else None

    def tail(self, x: Tensor, n: int) -> Tensor:
        return tail_by_frames(self.frames, x, n)


class FoldedCausalConv1d(TailByFrames, CausalConv1d):
    """CausalConv1d whose new history is taken by LastFrames (tail_by_frames)."""

    def __init__(self, module: CausalConv1d):
        nn.Module.__init__(self)
        self.conv, self.pad, self.state_name, self.rate = module.conv, module.pad, module.state_name, module.rate
        self.fold_tail()


def causal_conv_transpose1d_by_phases(x: Tensor, history: Tensor | None, phases: Tensor, bias: Tensor | None,
                                      stride: int, tail: Tail = last_samples) -> tuple[Tensor, Tensor]:
    """layers.causal_conv_transpose1d computed as the stride-1 causal conv of its output phases
    (phase_weight: one output channel per phase; its history is the transposed conv's H input
    frames), the phases interleaved in time. XNNPACK runs this conv 1.6-3.7x faster than its
    transposed conv (Subconv2D) at real-size shapes. No slice of the chunk axis on the way to y (a
    slice of a dynamic axis is not delegated). x [B, Cin, T], history [B, Cin, H] or None, phases
    [Cout * S, Cin, H + 1], bias [1, Cout, 1] or None -> y [B, Cout, T*S], new history [B, Cin, H]."""
    y, new = causal_conv1d(x, history, phases, None, 1, 1, tail)  # [B, Cout * S, T]: out[S*t + j] = y[c*S + j, t]
    y = interleave_phases(y, stride)
    return (y + bias if bias is not None else y), new


class FoldedConvTranspose1d(TailByFrames, CausalConvTranspose1d):
    """CausalConvTranspose1d computed by causal_conv_transpose1d_by_phases, its bias a [1, Cout, 1]
    buffer, its new history taken by LastFrames. The transposed conv's weight is dropped; `conv`
    stays for its shape (state_shapes, the decoder's reach)."""

    def __init__(self, module: CausalConvTranspose1d):  # module belongs to prepare()'s private copy
        nn.Module.__init__(self)
        self.conv, self.overlap, self.pad, self.state_name = module.conv, module.overlap, module.pad, module.state_name
        self.rate = module.rate
        self.fold_tail()
        bias = module.conv.bias
        self.register_buffer("bias3", None if bias is None else bias.detach()[None, :, None])
        self.phases = nn.Parameter(phase_weight(module.conv.weight.detach(), module.conv.stride[0]))
        self.conv.weight, self.conv.bias = None, None  # carried by phases and bias3 alone

    def _conv(self, x: Tensor, history: Tensor | None) -> tuple[Tensor, Tensor]:
        return causal_conv_transpose1d_by_phases(x, history, self.phases, self.bias3, self.conv.stride[0], self.tail)


def rotate_half_matrix(dim: int) -> Tensor:
    """[D, D] R with x @ R = cat(-x[D/2:], x[:D/2]) (RoPE's rotate-half): one +-1 per column, so
    the product is exact."""
    half = dim // 2
    r = torch.zeros(dim, dim)
    r[torch.arange(half) + half, torch.arange(half)] = -1.0
    r[torch.arange(half), torch.arange(half) + half] = 1.0
    return r


class Rotate(nn.Module):
    """x [..., D] -> x @ R (rotate_half_matrix) as a linear: XNNPACK delegates it at a dynamic chunk,
    where the halves' slices of the rotate-half would run outside the delegate and split it.
    Quantizers leave it alone (precision.EXACT_MODULES)."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("weight", rotate_half_matrix(dim).t().contiguous())

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


class FoldedAttention(Attention):
    """Attention whose RoPE rotate-half is a linear (Rotate), and whose new K/V cache is taken by
    LastFrames (frames of D values). [B, T, hidden] -> [B, T, hidden]."""

    def __init__(self, module: Attention):
        nn.Module.__init__(self)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = module.q_proj, module.k_proj, module.v_proj, module.o_proj
        self.heads, self.kv_heads, self.head_dim, self.cache = module.heads, module.kv_heads, module.head_dim, module.cache
        self.state_name = module.state_name
        self.rotate = Rotate(module.head_dim)
        self.frames = LastFrames(module.cache, 1)

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return x * cos + self.rotate(x) * sin

    def keep_cache(self, x: Tensor) -> Tensor:
        b, h, _, d = x.shape
        return self.frames(x.view(b * h, -1, d)).contiguous().view(b, h, self.cache, d)


class ShiftTrim(Trim):
    """Trim as a depthwise conv of two taps (0, 1) dilated by k: y[t] = x[t + k], exactly, over
    [B, C, n] -> [B, C, n - k]. XNNPACK delegates a conv at a dynamic length, where a slice would
    run outside the delegate and split it (the windowed program's cuts sit on its main path).
    Quantizers leave it alone (precision.EXACT_MODULES)."""

    def __init__(self, channels: int):
        nn.Module.__init__(self)
        # a buffer (a weight XNNPACK can pack), sliced per call to the channels: folded at lowering
        self.register_buffer("taps", torch.tensor([0.0, 1.0]).repeat(channels, 1, 1))

    def forward(self, x: Tensor, k: int) -> Tensor:
        c = x.shape[1]
        return F.conv1d(x, self.taps[:c].to(x.dtype), dilation=k, groups=c)


class RMSNorm4D(RMSNorm):
    def __init__(self, module: RMSNorm):
        nn.Module.__init__(self)
        self.weight, self.eps = module.weight, module.eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm_4d(x, self.weight, self.eps, self.upcast)


class LayerNorm4D(nn.Module):
    def __init__(self, module: nn.LayerNorm):
        super().__init__()
        self.weight, self.bias, self.eps = module.weight, module.bias, module.eps

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm_4d(x, self.weight, self.bias, self.eps)


class SwiGLU4Export(MLP):
    """MLP with SiLU as x * sigmoid(x), in the input's dtype. [B, T, hidden] -> [B, T, hidden]."""

    def __init__(self, module: MLP):
        nn.Module.__init__(self)
        self.gate_proj, self.up_proj, self.down_proj = module.gate_proj, module.up_proj, module.down_proj

    def forward(self, x: Tensor) -> Tensor:
        gate = self.gate_proj(x)
        return self.down_proj(gate * torch.sigmoid(gate) * self.up_proj(x))


class FoldedTransformer(Transformer):
    """Transformer whose RoPE inverse frequencies are a buffer, computed by the same function."""

    KEEP_FP32 = ("inv_freq_table",)  # precision.to_half: positions * inv_freq stay float32, as unfolded

    def __init__(self, module: Transformer):
        nn.Module.__init__(self)
        self.input_proj, self.layers, self.norm, self.output_proj = (
            module.input_proj, module.layers, module.norm, module.output_proj)
        self.head_dim, self.theta, self.cache, self.window = module.head_dim, module.theta, module.cache, module.window
        self.groups = module.groups
        self.register_buffer("inv_freq_table", module.inv_freq(module.input_proj.weight.dtype))

    def inv_freq(self, dtype: torch.dtype) -> Tensor:
        return self.inv_freq_table


# module type -> its export-ready replacement
FOLDS: dict[type, type] = {
    SnakeBeta: FoldedSnake, ResidualVQ: FoldedRVQ, CausalConv1d: FoldedCausalConv1d, CausalConvTranspose1d: FoldedConvTranspose1d,
    RMSNorm: RMSNorm4D, nn.LayerNorm: LayerNorm4D, Transformer: FoldedTransformer, Attention: FoldedAttention,
    MLP: SwiGLU4Export,
}  # module type -> its folded replacement


def prepare(decoder: Code2Wav) -> Code2Wav:
    """A copy of `decoder` with every FOLDS module replaced (the original is untouched)."""
    prepared = copy.deepcopy(decoder)
    # deepest first: a fold that copies its children (FoldedTransformer) then holds folded ones
    for name, module in reversed(list(prepared.named_modules())):
        for child_name, child in list(module.named_children()):
            if type(child) in FOLDS:
                setattr(module, child_name, FOLDS[type(child)](child))
    prepared.trim = ShiftTrim(max(max(m.in_channels, m.out_channels) for m in prepared.modules()
                                  if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))))
    return prepared.eval().requires_grad_(False)


FACTORIES = ("aten.zeros.default", "aten.full.default")  # ops that build a tensor from sizes alone


def share_factories(graph: torch.fx.Graph) -> int:
    """The factory nodes of `graph` (FACTORIES; prepare's LastFrames builds a [T, 1] zeros per state
    update) made cheap to run outside a delegate, in place:

    - a symbolic size equal to an input's size is read from that input. Traced, it is read from the
      tensor it was computed from, which a delegate would then have to hand out whole, only for
      its size, and the factory would sit between two delegate calls.
    - equal factories (same op, same arguments, a symbolic size compared by its expression) are
      merged into the first: export does not merge them, and each would be one more op outside.

    Returns how many nodes were merged."""
    inputs: dict[str, tuple] = {}  # size expression -> (placeholder, dim)
    for node in graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and isinstance(val, torch.Tensor):
            for dim, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt):
                    inputs.setdefault(str(size), (node, dim, size))
    read: dict[str, torch.fx.Node] = {}  # size expression -> its sym_size node on the input

    def from_input(a):
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not isinstance(val, torch.SymInt) or str(val) not in inputs:
            return a
        if str(val) not in read:
            placeholder, dim, size = inputs[str(val)]
            last = [n for n in graph.nodes if n.op == "placeholder"][-1]
            with graph.inserting_after(last):
                read[str(val)] = graph.call_function(torch.ops.aten.sym_size.int, (placeholder, dim))
            read[str(val)].meta["val"] = size
        return read[str(val)]

    def key(a):
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            return ("sym", str(val)) if isinstance(val, torch.SymInt) else ("node", a.name)
        if isinstance(a, (list, tuple)):
            return tuple(key(x) for x in a)
        return repr(a)

    first: dict = {}
    merged = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or str(node.target) not in FACTORIES:
            continue
        node.args = torch.fx.node.map_arg(node.args, from_input)
        k = (str(node.target), key(node.args), key(tuple(sorted(node.kwargs.items()))))
        if k in first:
            node.replace_all_uses_with(first[k])
            graph.erase_node(node)
            merged += 1
        else:
            first[k] = node
    graph.eliminate_dead_code()  # the sizes no longer read from intermediate tensors
    return merged
