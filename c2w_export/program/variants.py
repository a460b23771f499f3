"""Export variants: the I/O contracts that ship, and their specs.

Each variant is one method whose chunk axis is dynamic, from 1 to `max_chunk` frames (memory is
planned at the upper bound; outputs are resized every call):

- windowed (stateless, method `windowed`): (codes int64 [1, Q, context + chunk], history int64 [1])
  -> wav float32 [1, chunk * hop], the audio of the last `chunk` frames only. The quantizer and
  transformer recompute the whole window every call; the conv stack after them runs only on the
  frames that audio depends on (Code2Wav.stack_frames: chunk + 10 frames at the first upsample
  stage, chunk + 1 at the decoder's last blocks). `history` (0..context) counts the real frames
  before the chunk; the window's first `context - history` frames are absent (a stream start) and
  are decoded as the offline decode's causal zero padding, so a windowed stream is exact from frame 0.
- stateful (method `stateful`): (codes int64 [1, Q, chunk], *state) -> (wav float32 [1, chunk * hop],
  *new_state). State order and shapes are `Code2Wav.state_spec()` (no chunk axis); nothing is
  mutated in place.

A spec's shapes are those at `max_chunk`; a tensor with a chunk axis names it (`chunk_axis`) and
how many elements one frame adds there (`per_chunk`), so `TensorSpec.at(chunk)` gives any call's shape.

The contract's float tensors (wav, state) are in `io_dtype`: the decoder's dtype, at least float32.
A half-precision decoder (program/precision.py) keeps the float32 contract: it casts the state in
and the wav and state out, so decode, verify and bundles read every precision the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..model.decoder import Code2Wav
from .codes import check_chunk, check_history, check_windows, random_codes
from .prepare import share_factories

VARIANTS = ("windowed", "stateful")
HISTORY = "history"  # the windowed methods' second input: real history frames in the window


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # at the method's max_chunk
    dtype: str  # torch dtype name without the "torch." prefix
    chunk_axis: int | None = None  # the axis that grows with the chunk (None: static)
    per_chunk: int = 0  # elements one chunk frame adds along chunk_axis

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                **({"chunk_axis": self.chunk_axis, "per_chunk": self.per_chunk} if self.chunk_axis is not None else {})}

    @classmethod
    def from_json(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], tuple(d["shape"]), d["dtype"], d.get("chunk_axis"), int(d.get("per_chunk", 0)))

    def at(self, chunk: int, max_chunk: int) -> tuple[int, ...]:
        """The shape of a call with `chunk` frames (the spec's shape is at `max_chunk`)."""
        if self.chunk_axis is None:
            return self.shape
        shape = list(self.shape)
        shape[self.chunk_axis] -= (max_chunk - chunk) * self.per_chunk
        return tuple(shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class MethodSpec:
    method: str  # "windowed" or "stateful"
    variant: str  # "windowed" | "stateful"
    max_chunk: int  # the largest chunk a call takes (memory is planned for it)
    context: int  # 0 for stateful
    inputs: tuple[TensorSpec, ...]  # codes first, then the state (stateful)
    outputs: tuple[TensorSpec, ...]  # wav first, then the new state (stateful)
    min_chunk: int = 1

    def to_json(self) -> dict:
        return {"method": self.method, "variant": self.variant, "min_chunk": self.min_chunk,
                "max_chunk": self.max_chunk, "context": self.context,
                "inputs": [s.to_json() for s in self.inputs], "outputs": [s.to_json() for s in self.outputs]}

    @classmethod
    def from_json(cls, d: dict) -> "MethodSpec":
        return cls(d["method"], d["variant"], int(d["max_chunk"]), int(d["context"]),
                   tuple(TensorSpec.from_json(s) for s in d["inputs"]),
                   tuple(TensorSpec.from_json(s) for s in d["outputs"]), int(d["min_chunk"]))

    @property
    def chunks(self) -> range:
        """Every chunk size a call may take."""
        return range(self.min_chunk, self.max_chunk + 1)


def method_name(variant: str) -> str:
    """The one method of a variant."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    return variant


def _dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def io_dtype(decoder: Code2Wav) -> torch.dtype:
    """The dtype of the programs' float inputs and outputs: the decoder's, at least float32."""
    return torch.promote_types(decoder.dtype, torch.float32)


def _io(t: Tensor, dtype: torch.dtype) -> Tensor:
    """A float tensor in `dtype` (int tensors, the position, as they are)."""
    # a same-dtype .to() still traces as two graph nodes per tensor (to + a metadata assert)
    return t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t


def mono(wav: Tensor) -> Tensor:
    """wav [1, 1, n] -> [1, n]: a view with the sample axis inferred, which XNNPACK delegates (a
    select of the channel, or a view with a symbolic size, would copy the whole chunk's audio
    outside the delegate)."""
    return wav.view(wav.shape[0], -1)


def initial_state(decoder: Code2Wav) -> tuple[Tensor, ...]:
    """A stream's start state as the stateful methods take it: tensors in `state_spec()` order, floats
    in io_dtype."""
    init = decoder.initial_state()
    return tuple(_io(init[n], io_dtype(decoder)) for n, _, _ in decoder.state_spec())


class _Variant(nn.Module):
    """A variant's module: any chunk 1..max_chunk per call (eager reads it from the codes; an
    exported program has that axis dynamic up to max_chunk)."""

    variant: str  # the name in VARIANTS, manifests and method names

    def __init__(self, decoder: Code2Wav, max_chunk: int, context: int):
        super().__init__()
        if max_chunk < 1:
            raise ValueError(f"max_chunk must be >= 1, got {max_chunk}")
        self.decoder, self.max_chunk, self.context = decoder, max_chunk, context

    @property
    def method(self) -> str:
        return method_name(self.variant)

    def spec(self) -> MethodSpec:
        return MethodSpec(self.method, self.variant, self.max_chunk, self.context,
                          tuple(self.input_specs()), tuple(self.output_specs()))

    def dynamic_shapes(self, flat: bool = False) -> tuple:
        """torch.export's dynamic_shapes, shaped like forward's arguments (`flat`: one entry per
        input tensor, as a graph of it takes them, e.g. PT2E's converted graph): the codes' frame
        axis from the min to the max chunk, everything else static. A Dim.DYNAMIC: a named Dim
        fails on guards such as min(7 + t, t*t + 7*t) == 7 + t, true for every t >= 1 but not
        provable by the solver."""
        from torch.export import Dim

        codes = self.input_specs()[0]
        low, high = self.context + 1, codes.shape[codes.chunk_axis]
        # one size (--max-chunk 1): a static axis; torch.export refuses a Dim whose range is one size
        frames = {codes.chunk_axis: Dim.DYNAMIC(min=low, max=high)} if high > low else None
        if flat:
            return (frames, *([None] * (len(self.input_specs()) - 1)))
        return (frames, self._static_shapes())

    def _wav_spec(self) -> TensorSpec:
        hop = self.decoder.config.hop
        return TensorSpec("wav", (1, self.max_chunk * hop), _dtype_name(io_dtype(self.decoder)), 1, hop)

    def _codes_spec(self) -> TensorSpec:
        return TensorSpec("codes", (1, self.decoder.config.num_quantizers, self.context + self.max_chunk), "int64", 2, 1)


class Windowed(_Variant):
    """(codes int64 [1, Q, context + chunk], history int64 [1]) -> wav [1, chunk * hop]."""

    variant = "windowed"

    def forward(self, codes: Tensor, history: Tensor) -> Tensor:
        # no state: the window starts it; the conv stack runs on the frames the chunk's audio depends on
        wav, _ = self.decoder.step(codes, {}, first=self.context - history, context=self.context)
        return _io(mono(wav), io_dtype(self.decoder))

    def input_specs(self) -> list[TensorSpec]:
        return [self._codes_spec(), TensorSpec(HISTORY, (1,), "int64")]

    def output_specs(self) -> list[TensorSpec]:
        return [self._wav_spec()]

    def _static_shapes(self):
        return None  # history

    def state_specs(self) -> list[TensorSpec]:
        return []

    def initial_state(self) -> tuple[Tensor, ...]:
        return ()

    def full_history(self) -> Tensor:
        """The `history` input of a window with `context` real frames of history (the steady state)."""
        return torch.tensor([self.context], dtype=torch.int64)


class Stateful(_Variant):
    """(codes int64 [1, Q, chunk], *state) -> (wav [1, chunk * hop], *new_state)."""

    variant = "stateful"

    def __init__(self, decoder: Code2Wav, max_chunk: int):
        super().__init__(decoder, max_chunk, 0)
        self.names = [n for n, _, _ in decoder.state_spec()]

    def forward(self, codes: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        io = io_dtype(self.decoder)
        dtypes = [d for _, _, d in self.decoder.state_spec()]  # each part's own, as the decoder is now
        wav, new = self.decoder.step(codes, {n: _io(s, d) for n, s, d in zip(self.names, state, dtypes)})
        return (_io(mono(wav), io), *(_io(new[n], io) for n in self.names))

    def input_specs(self) -> list[TensorSpec]:
        return [self._codes_spec(), *self.state_specs()]

    def output_specs(self) -> list[TensorSpec]:
        return [self._wav_spec(), *self.state_specs()]

    def _static_shapes(self):
        return (None,) * len(self.names)  # *state

    def state_specs(self) -> list[TensorSpec]:
        io = io_dtype(self.decoder)
        return [TensorSpec(n, s, _dtype_name(io if d.is_floating_point else d)) for n, s, d in self.decoder.state_spec()]

    def initial_state(self) -> tuple[Tensor, ...]:
        return initial_state(self.decoder)


def make_variant(decoder: Code2Wav, variant: str, max_chunk: int, context: int) -> Windowed | Stateful:
    if variant == "windowed":
        return Windowed(decoder, max_chunk, context).eval()
    if variant == "stateful":
        return Stateful(decoder, max_chunk).eval()
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


def export_variant(module: nn.Module, inputs: tuple, variant: Windowed | Stateful | None = None):
    """torch.export of `module` (a variant, or a graph of `variant`, e.g. PT2E-converted) with the
    chunk axis dynamic (`variant.dynamic_shapes()`). Where a call may take 1 frame (stateful), sizes are
    traced size-obliviously: by default a dim of size 1 is specialized away (the range would start
    at 2); the gate then checks chunk 1 against eager like every other size. Raises ValueError when
    export pinned the chunk axis to one size anyway (a conv's guard Ne(t, 1) does, for a range of
    1..2)."""
    import torch.fx.experimental._config as fx_config

    variant = variant if variant is not None else module
    shapes = variant.dynamic_shapes(flat=not isinstance(module, _Variant))
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=variant.context == 0):
        ep = torch.export.export(module, tuple(inputs), strict=False, dynamic_shapes=shapes)
    share_factories(ep.graph)  # the state updates' zeros (prepare.LastFrames): one, sized from the codes
    ep.graph_module.recompile()
    spec = variant.input_specs()[0]
    codes = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs)
    size = codes.meta["val"].shape[spec.chunk_axis]
    want = (variant.context + 1, spec.shape[spec.chunk_axis])
    got = (size, size) if not isinstance(size, torch.SymInt) else (
        int(ep.range_constraints[size.node.expr].lower), int(ep.range_constraints[size.node.expr].upper))
    if got[0] > want[0] or got[1] < want[1]:  # a guard narrowed the range (Ne(t, 1) on 1..2 leaves t = 2)
        raise ValueError(f"torch.export narrowed the codes' frame axis of {variant.method} to {got[0]}..{got[1]} (wanted "
                         f"{want[0]}..{want[1]}: chunks {want[0] - variant.context}..{variant.max_chunk}), so the "
                         f"program would refuse the rest; a guard in the graph pinned it")
    return ep


def example_inputs(module: Windowed | Stateful, codes: Tensor | None = None, seed: int = 0) -> tuple[Tensor, ...]:
    """Inputs matching the module's input specs at max_chunk: random codes (or `codes`) plus the
    initial state (stateful) or a full history (windowed)."""
    if codes is None:
        _, q, t = module.input_specs()[0].shape
        codes = random_codes(q, t, module.decoder.config.codebook_size, seed)
    if isinstance(module, Windowed):
        return (codes, module.full_history())
    return (codes, *module.initial_state())


def parity_inputs(module: Windowed | Stateful, n: int, seed: int, chunk: int | None = None) -> list[tuple[Tensor, ...]]:
    """The inputs of n check calls, without state: n independent (codes, history) windows
    (windowed; codes.check_history cycles partial, full and no history) or n consecutive (codes,)
    chunks of one stream (stateful), of chunk sizes codes.check_chunk cycles through (the max, 1,
    one drawn between), so one check covers both ends of the dynamic axis and its inside; or all
    of size `chunk`."""
    _, q, _ = module.input_specs()[0].shape
    size = module.decoder.config.codebook_size
    calls = []
    for i in range(n):
        t = module.context + (chunk if chunk is not None else check_chunk(module.max_chunk, i, seed))
        c = check_windows(q, t, size, i + 1, seed)[i]  # window i of the pattern cycle, at this call's size
        calls.append((c, check_history(module.context, i, seed)) if isinstance(module, Windowed) else (c,))
    return calls
