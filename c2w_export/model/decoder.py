"""Code2Wav: RVQ codes [B, Q, T] -> waveform [B, 1, T*hop].

Module names and parameter names follow the checkpoint (keys under `decoder.`), so
`load_state_dict` is strict against the real file. One forward serves offline and streaming:
`step(codes, state) -> (wav, new_state)`; offline decoding is one step without state, which
equals one step from `initial_state()` (tests/test_decoder.py checks it).

Every part computes in its own dtype (layers.into casts what flows into it): one dtype throughout,
except in a mixed-precision copy (float32 parts in a float16 decoder, program/precision.py), whose
state tensors are each in their part's dtype.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import DecoderConfig
from .layers import (
    CausalConv1d, CausalConvTranspose1d, LayerScale, RMSNorm, SnakeBeta, State, StatefulLeaf,
    Trim, apply_rope, attention, compute_dtype, group_bias, into, mask_bias, rope_cos_sin, rope_inv_freq,
    sliding_window_mask,
)
from .validate import check_codes

POSITION = "pos"  # state name of the stream's frame position, int64 [1]
USAGE_FLOOR = 1e-5  # cluster_usage is clamped to at least this (dead codes have usage 0)
OUTPUT_LIMIT = 1.0  # the waveform is clamped to [-OUTPUT_LIMIT, OUTPUT_LIMIT]


# ---------------------------------------------------------------- split RVQ
class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def embedding(self) -> Tensor:
        """[size, dim]: the EMA codebook, usage clamped away from zero."""
        return self.embedding_sum / self.cluster_usage.clamp(min=USAGE_FLOOR)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class ResidualVQ(nn.Module):
    """`n` codebooks of width codebook_dim//2 and a 1x1 projection out to codebook_dim.
    `input_proj` is the encoder side: kept so the checkpoint loads strictly, unused here."""

    def __init__(self, n: int, size: int, codebook_dim: int):
        super().__init__()
        dim = codebook_dim // 2
        self.input_proj = nn.Conv1d(codebook_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, codebook_dim, 1, bias=False)
        self.vq = _VQStack(n, size, dim)

    def forward(self, codes: Tensor) -> Tensor:
        """codes [B, n, T] -> [B, codebook_dim, T]."""
        summed = sum(F.embedding(codes[:, i], vq._codebook.embedding()) for i, vq in enumerate(self.vq.layers))
        return self.output_proj(into(summed.transpose(1, 2), self.output_proj))


class SplitRVQ(nn.Module):
    """1 semantic codebook + (Q-1) acoustic codebooks, projected separately and summed."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.rvq_first = ResidualVQ(1, cfg.codebook_size, cfg.codebook_dim)
        self.rvq_rest = ResidualVQ(cfg.num_quantizers - 1, cfg.codebook_size, cfg.codebook_dim)

    def forward(self, codes: Tensor) -> Tensor:
        """codes [B, Q, T] -> [B, codebook_dim, T]."""
        return self.rvq_first(codes[:, :1]) + self.rvq_rest(codes[:, 1:])


# ---------------------------------------------------------------- transformer
class Attention(StatefulLeaf):
    """Sliding-window causal self-attention with RoPE. State `<name>.k` / `<name>.v`:
    [B, Hkv, W-1, D], the rotated keys and values of the W-1 frames before this chunk."""

    upcast = True  # softmax in at least float32 (layers.work_dtype)

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=bias)
        self.heads, self.kv_heads, self.head_dim, self.cache = h, kv, d, cfg.kv_cache_frames

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x [B, H, T, D] rotated (layers.apply_rope)."""
        return apply_rope(x, cos, sin)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        shape = (self.kv_heads, self.cache, self.head_dim)
        return {f"{self.state_name}.k": shape, f"{self.state_name}.v": shape}

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, bias: Tensor,
                state: State) -> tuple[Tensor, dict[str, Tensor]]:
        """x [B, T, hidden]; cos/sin [T, D]; bias [G*T, W-1+T] (layers.group_bias of mask_bias;
        [G*T, T] without a cache in the state) -> [B, T, hidden]. Reshapes infer the frame axis (-1)."""
        b = x.shape[0]
        q = self.rope(self.q_proj(x).view(b, -1, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = self.rope(self.k_proj(x).view(b, -1, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, -1, self.kv_heads, self.head_dim).transpose(1, 2)
        kn, vn = f"{self.state_name}.k", f"{self.state_name}.v"
        cached = kn in state
        keys = torch.cat([state[kn], k], dim=2) if cached else k
        values = torch.cat([state[vn], v], dim=2) if cached else v
        out = attention(q, keys, values, bias, self.head_dim ** -0.5, self.upcast)
        out = self.o_proj(out.transpose(1, 2).contiguous().view(b, -1, self.heads * self.head_dim))
        if not cached:
            return out, {}
        return out, {kn: self.keep_cache(keys), vn: self.keep_cache(values)}

    def keep_cache(self, x: Tensor) -> Tensor:
        """Keys or values [B, Hkv, W-1+T, D] -> the last W-1 frames [B, Hkv, W-1, D], the new cache (a
        slice; an export folds it into what its backend delegates, program/prepare.py)."""
        return x[:, :, x.shape[2] - self.cache:]


class MLP(nn.Module):
    """SwiGLU."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, bias: Tensor,
                state: State) -> tuple[Tensor, dict[str, Tensor]]:
        a, new = self.self_attn(self.input_layernorm(x), cos, sin, bias, state)
        x = x + self.self_attn_layer_scale(a)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x))), new


class Transformer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.head_dim, self.theta, self.cache = cfg.head_dim, float(cfg.rope_theta), cfg.kv_cache_frames
        self.window = cfg.sliding_window
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads  # query heads per K/V head

    def inv_freq(self, dtype: torch.dtype) -> Tensor:
        """RoPE inverse frequencies [head_dim] (computed per call, as upstream does)."""
        return rope_inv_freq(self.head_dim, self.theta, dtype)

    def forward(self, x: Tensor, pos: Tensor | None, state: State,
                present: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """x [B, T, latent], pos int64 [1] (the chunk's first frame; None: a stream start without
        state, keys are this chunk's only), present bool [T] or None (without state only: frames
        that are not absent history; a present query sees no absent key) -> [B, T, latent]."""
        t = x.shape[1]
        q_pos = torch.arange(t, dtype=torch.int64) if pos is None else pos + torch.arange(t, dtype=torch.int64)
        k_pos = q_pos if pos is None else torch.cat([pos - self.cache + torch.arange(self.cache, dtype=torch.int64), q_pos])
        h = self.input_proj(into(x, self.input_proj))
        if self.layers:
            h = into(h, self.layers[0])  # the layers share one dtype
        cos, sin = rope_cos_sin(q_pos, self.inv_freq(h.dtype), h.dtype)
        allowed = sliding_window_mask(q_pos, k_pos, self.window)
        if present is not None:  # absent queries keep their keys: their rows stay finite, and are dropped later
            allowed = allowed & (present[None, :] | ~present[:, None])
        bias = group_bias(mask_bias(allowed, h.dtype), self.groups)  # once for every layer
        new: dict[str, Tensor] = {}
        for layer in self.layers:
            h, s = layer(h, cos, sin, bias, state)
            new.update(s)
        return self.output_proj(into(self.norm(into(h, self.norm)), self.output_proj)), new


# ---------------------------------------------------------------- conv stages
class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv (k=7), LayerNorm, 4x MLP with GELU, gamma scale, residual. [B, C, T]."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor, state: State, keep: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        # each part in its own dtype; GELU in pwconv1's (XNNPACK has no float16 GELU: a mixed decoder
        # keeps pwconv1 float32, program/precision.py)
        h, new = self.dwconv(into(x, self.dwconv), state, keep)
        h = self.norm(into(h.transpose(1, 2), self.norm))
        h = self.pwconv2(into(F.gelu(self.pwconv1(into(h, self.pwconv1))), self.pwconv2))
        return x + (self.gamma * into(h, self)).transpose(1, 2), new


class ResidualUnit(nn.Module):
    """Snake, dilated causal conv k=7, snake, 1x1 conv, residual. [B, C, T]."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: Tensor, state: State, keep: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        h, new = self.conv1(self.act1(x), state, keep)
        h, _ = self.conv2(self.act2(h), state)
        return x + h, new


class DecoderBlock(nn.Module):
    """Snake, causal transposed conv (kernel 2r, stride r) halving channels, 3 residual units
    (dilations 1, 3, 9). [B, C, T] -> [B, C/2, T*r]. Checkpoint layout `block.0..4`."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalConvTranspose1d(cin, cout, 2 * rate, rate)]
            + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x: Tensor, state: State, keep: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        x = self.block[0](x)
        new: dict[str, Tensor] = {}
        for layer in self.block[1:]:
            x, s = layer(x, state, keep)
            new.update(s)
        return x, new


class _UpsampleStage(nn.ModuleList):
    """Checkpoint layout `upsample.i.{0,1}`: transposed conv (kernel = stride), ConvNeXt block."""

    def forward(self, x: Tensor, state: State, keep: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        x, a = self[0](into(x, self[0]), state, keep)
        x, b = self[1](x, state, keep)  # the ConvNeXt block casts into each of its parts
        return x, {**a, **b}


# ---------------------------------------------------------------- the decoder
class Code2Wav(nn.Module):
    """RVQ codes int64 [B, Q, T] -> waveform [B, 1, T*hop] in [-1, 1]."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.config = cfg
        self.quantizer = SplitRVQ(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = Transformer(cfg)
        self.upsample = nn.ModuleList(
            _UpsampleStage([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2 ** i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
            + [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)]
        )
        self.trim = Trim()
        for name, module in self.named_modules():
            if isinstance(module, StatefulLeaf):
                module.state_name = name
        modules = dict(self.named_modules())
        for name, rate in self.leaf_rates().items():
            modules[name].rate = rate

    # -------------------------------------------------------- state
    def state_spec(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """Ordered (name, shape, dtype) of the streaming state for batch 1; `pos` first."""
        spec = [(POSITION, (1,), torch.int64)]
        for module in self.modules():
            if isinstance(module, StatefulLeaf):  # in its leaf's dtype (a mixed-precision decoder has two)
                spec += [(n, (1, *s), compute_dtype(module)) for n, s in module.state_shapes().items()]
        return spec

    def initial_state(self) -> dict[str, Tensor]:
        """A stream's start: position 0, zero conv history (= causal zero padding), zero K/V
        (masked out because their positions are negative)."""
        return {n: torch.zeros(s, dtype=d) for n, s, d in self.state_spec()}

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of its first stage (pre_conv): every stage's, but in a mixed-precision copy."""
        return self.pre_conv.conv.weight.dtype

    def _stack(self) -> list[nn.Module]:
        """The conv stack after the transformer, in order: the upsample stages, then the decoder's layers."""
        return [*self.upsample, *self.decoder]

    def _stack_reaches(self) -> list[Fraction]:
        """Per layer of `_stack()`: the code frames of history its output reaches back through the
        layer's causal convs' histories and transposed convs' overlaps, each at its own rate (exact)."""
        out = [Fraction(0)] * len(self._stack())
        for i, m, rate in self._stack_walk():
            if isinstance(m, (CausalConv1d, CausalConvTranspose1d)):
                out[i] += Fraction(m.pad, rate)  # input frames its history reaches back
        return out

    def receptive_frames(self) -> int:
        """Code frames of history that can change a frame's audio: every causal conv's history and
        transposed conv's overlap, each at its own rate, plus the sliding-window attention chained
        over the layers (tiny: 26, real size: 580). A windowed program whose context covers it is
        exact in its steady state."""
        reach = self.pre_conv.pad + len(self.pre_transformer.layers) * self.config.kv_cache_frames
        return math.ceil(reach + sum(self._stack_reaches()))

    def stack_frames(self, tail: int) -> list[int]:
        """Per layer of the conv stack after the transformer: the code frames of its input that the
        audio of the last `tail` frames depends on. Walked back from the output in whole samples at
        each rate (a causal conv needs its history; a transposed conv of kernel K, stride S needs
        input i for output n when i*S <= n <= i*S + K-1), so it is exact where the summed fractional
        reaches of `_stack_reaches` would round up. A window cut to these frames before each layer
        computes that audio as the whole window does."""
        need, rate, out = 0, self.config.hop, []  # samples needed before the tail's first, at `rate` per frame
        for layer in reversed(self._stack()):
            for m in reversed(list(layer.modules())):
                if isinstance(m, CausalConv1d):
                    need += m.pad
                elif isinstance(m, CausalConvTranspose1d):
                    stride = m.conv.stride[0]
                    need = (need + m.conv.kernel_size[0] - 1) // stride
                    rate //= stride
            out.append(tail + -(-need // rate))
        return out[::-1]

    def leaf_rates(self) -> dict[str, int]:
        """{state_name: samples per code frame of its input} for every StatefulLeaf: 1 before the conv
        stack (the pre-conv, the attention's frames), then each transposed conv's stride on."""
        rates = {m.state_name: 1 for m in [self.pre_conv, *self.pre_transformer.modules()] if isinstance(m, StatefulLeaf)}
        rates.update((m.state_name, rate) for _, m, rate in self._stack_walk() if isinstance(m, StatefulLeaf))
        return rates

    # -------------------------------------------------------- compute
    def _stack_rates(self) -> list[int]:
        """Per layer of `_stack()`: samples per code frame of its input."""
        first: dict[int, int] = {}
        for i, _, rate in self._stack_walk():
            first.setdefault(i, rate)  # the layer itself comes first
        return list(first.values())

    def _stack_walk(self):
        """(index in `_stack()`, module, samples per code frame of its input) for every module of the
        conv stack's layers, in data order: a transposed conv's own input is at the rate before it."""
        rate = 1
        for i, layer in enumerate(self._stack()):
            for m in layer.modules():
                yield i, m, rate
                if isinstance(m, CausalConvTranspose1d):
                    rate *= m.conv.stride[0]

    def step(self, codes: Tensor, state: State, first: Tensor | None = None,
             context: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Unchecked core. codes int64 [B, Q, T], state -> (wav [B, 1, T*hop], new state).
        An empty state decodes a stream start without state (no new state is returned).

        `first` int64 [1] (empty state only): frames before it are absent history, decoded as
        the offline decode's causal zero padding, so the samples from `first` on equal the offline
        decode of `codes[..., first:]`. The absent frames' own samples are meaningless.

        `context` (empty state only): the first `context` frames only feed the rest; wav is the
        audio of the T - context frames after them, [B, 1, (T - context)*hop]. The conv stack after
        the transformer then runs, layer by layer, on the frames that audio depends on
        (`stack_frames`), not on the whole window: before each layer the frames it does not need
        are dropped by `self.trim` (static counts, so a dynamic T stays one symbol)."""
        if context is not None and state:
            raise ValueError("step(context=...) decodes a window without state; a stream step keeps every frame")
        new: dict[str, Tensor] = {}
        frames = codes.shape[-1]
        present = None if first is None else torch.arange(frames, dtype=torch.int64) >= first
        keep = None if present is None else present.to(self.dtype)[None, None, :]
        h = self.quantizer(codes)
        h, s = self.pre_conv(into(h, self.pre_conv), state, keep)
        new.update(s)
        h, s = self.pre_transformer(h.transpose(1, 2), state.get(POSITION), state, present)
        new.update(s)
        h = h.transpose(1, 2)
        stack = self._stack()
        lead = context  # frames before the wanted audio still in h (None: every frame is wanted)
        extras = self.stack_frames(0) if context is not None else [None] * len(stack)  # frames needed before it
        for layer, extra, rate in zip(stack, extras, self._stack_rates()):
            if lead is not None and extra < lead:  # drop what the wanted audio does not depend on
                h = self.trim(h, (lead - extra) * rate)
                keep = self.trim(keep, lead - extra) if keep is not None else None
                lead = extra
            h = into(h, layer)
            if isinstance(layer, SnakeBeta):
                h = layer(h)
            else:
                h, s = layer(h, state, keep)
                new.update(s)
        if lead:
            h = self.trim(h, lead * self.config.hop)
        if POSITION in state:
            new[POSITION] = state[POSITION] + codes.shape[-1]
        return h.clamp(-OUTPUT_LIMIT, OUTPUT_LIMIT), new

    def forward(self, codes: Tensor) -> Tensor:
        """Offline decode with input checks. codes int64 [1, Q, T] -> float [1, 1, T*hop]."""
        self.check_codes(codes)
        wav, _ = self.step(codes, {})
        return wav

    def check_codes(self, codes: object, frames: int | None = None) -> None:
        """Raise validate.InputError naming what is wrong with `codes` (expects int64 [1, Q, T])."""
        check_codes(codes, self.config.num_quantizers, self.config.codebook_size, frames)
