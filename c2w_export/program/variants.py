"""Export variants: the I/O contracts that ship, and their specs.

- windowed (stateless, method `chunk_<n>`): (codes int64 [1, Q, context + chunk], history int64 [1])
  -> wav float32 [1, chunk * hop], the audio of the last `chunk` frames only. The quantizer and
  transformer recompute the whole window every call; the conv stack after them runs only on the
  frames that audio depends on (Code2Wav.stack_frames: chunk + 10 frames at the first upsample
  stage, chunk + 1 at the decoder's last blocks). `history` (0..context) counts the real frames before the chunk; the window's
  first `context - history` frames are absent (a stream start) and are decoded as the offline
  decode's causal zero padding, so a windowed stream is exact from frame 0.
- stateful (method `stateful_chunk_<n>`): (codes int64 [1, Q, chunk], *state) -> (wav float32
  [1, chunk * hop], *new_state). State order and shapes are `Code2Wav.state_spec()`; nothing is
  mutated in place.

The contract's float tensors (wav, state) are in `io_dtype`: the decoder's dtype, at least float32.
A half-precision decoder (program/precision.py) keeps the float32 contract: it casts the state in
and the wav and state out, so decode, verify and bundles read every precision the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..model.decoder import Code2Wav
from .codes import check_history, check_windows, random_codes

VARIANTS = ("windowed", "stateful")
HISTORY = "history"  # the windowed methods' second input: real history frames in the window


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], tuple(d["shape"]), d["dtype"])

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class MethodSpec:
    method: str  # "chunk_4" or "stateful_chunk_4"
    variant: str  # "windowed" | "stateful"
    chunk: int
    context: int  # 0 for stateful
    inputs: tuple[TensorSpec, ...]  # codes first, then the state (stateful)
    outputs: tuple[TensorSpec, ...]  # wav first, then the new state (stateful)

    def to_json(self) -> dict:
        return {"method": self.method, "variant": self.variant, "chunk": self.chunk, "context": self.context,
                "inputs": [s.to_json() for s in self.inputs], "outputs": [s.to_json() for s in self.outputs]}

    @classmethod
    def from_json(cls, d: dict) -> "MethodSpec":
        return cls(d["method"], d["variant"], int(d["chunk"]), int(d["context"]),
                   tuple(TensorSpec.from_json(s) for s in d["inputs"]),
                   tuple(TensorSpec.from_json(s) for s in d["outputs"]))

    @property
    def frames(self) -> int:
        """Code frames per call."""
        return self.context + self.chunk


def method_name(variant: str, chunk: int) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    return f"chunk_{chunk}" if variant == "windowed" else f"stateful_chunk_{chunk}"


def _dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def io_dtype(decoder: Code2Wav) -> torch.dtype:
    """The dtype of the programs' float inputs and outputs: the decoder's, at least float32."""
    return torch.promote_types(decoder.dtype, torch.float32)


def _io(t: Tensor, dtype: torch.dtype) -> Tensor:
    """A float tensor in `dtype` (int tensors, the position, as they are)."""
    # a same-dtype .to() still traces as two graph nodes per tensor (to + a metadata assert)
    return t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t


def initial_state(decoder: Code2Wav) -> tuple[Tensor, ...]:
    """A stream's start state as the stateful methods take it: tensors in `state_spec()` order, floats
    in io_dtype."""
    init = decoder.initial_state()
    return tuple(_io(init[n], io_dtype(decoder)) for n, _, _ in decoder.state_spec())


class _Variant(nn.Module):
    variant: str  # the name in VARIANTS, manifests and method names

    def __init__(self, decoder: Code2Wav, chunk: int, context: int):
        super().__init__()
        self.decoder, self.chunk, self.context = decoder, chunk, context

    @property
    def method(self) -> str:
        return method_name(self.variant, self.chunk)

    def spec(self) -> MethodSpec:
        return MethodSpec(self.method, self.variant, self.chunk, self.context,
                          tuple(self.input_specs()), tuple(self.output_specs()))

    def _wav_spec(self) -> TensorSpec:
        return TensorSpec("wav", (1, self.chunk * self.decoder.config.hop), _dtype_name(io_dtype(self.decoder)))

    def _codes_spec(self) -> TensorSpec:
        return TensorSpec("codes", (1, self.decoder.config.num_quantizers, self.context + self.chunk), "int64")


class Windowed(_Variant):
    """(codes int64 [1, Q, context + chunk], history int64 [1]) -> wav [1, chunk * hop]."""

    variant = "windowed"

    def forward(self, codes: Tensor, history: Tensor) -> Tensor:
        # no state: the window starts it; the conv stack runs on the frames the chunk's audio depends on
        wav, _ = self.decoder.step(codes, {}, first=self.context - history, tail=self.chunk)
        return _io(wav[:, 0], io_dtype(self.decoder))

    def input_specs(self) -> list[TensorSpec]:
        return [self._codes_spec(), TensorSpec(HISTORY, (1,), "int64")]

    def output_specs(self) -> list[TensorSpec]:
        return [self._wav_spec()]

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

    def __init__(self, decoder: Code2Wav, chunk: int):
        super().__init__(decoder, chunk, 0)
        self.names = [n for n, _, _ in decoder.state_spec()]

    def forward(self, codes: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        dtype, io = self.decoder.dtype, io_dtype(self.decoder)
        wav, new = self.decoder.step(codes, {n: _io(s, dtype) for n, s in zip(self.names, state)})
        return (_io(wav[:, 0], io), *(_io(new[n], io) for n in self.names))

    def input_specs(self) -> list[TensorSpec]:
        return [self._codes_spec(), *self.state_specs()]

    def output_specs(self) -> list[TensorSpec]:
        return [self._wav_spec(), *self.state_specs()]

    def state_specs(self) -> list[TensorSpec]:
        io = io_dtype(self.decoder)
        return [TensorSpec(n, s, _dtype_name(io if d.is_floating_point else d)) for n, s, d in self.decoder.state_spec()]

    def initial_state(self) -> tuple[Tensor, ...]:
        return initial_state(self.decoder)


def make_variant(decoder: Code2Wav, variant: str, chunk: int, context: int) -> Windowed | Stateful:
    if variant == "windowed":
        return Windowed(decoder, chunk, context).eval()
    if variant == "stateful":
        return Stateful(decoder, chunk).eval()
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


def example_inputs(module: Windowed | Stateful, codes: Tensor | None = None, seed: int = 0) -> tuple[Tensor, ...]:
    """Inputs matching the module's input specs: random codes (or `codes`) plus the initial state
    (stateful) or a full history (windowed)."""
    if codes is None:
        _, q, t = module.input_specs()[0].shape
        codes = random_codes(q, t, module.decoder.config.codebook_size, seed)
    if isinstance(module, Windowed):
        return (codes, module.full_history())
    return (codes, *module.initial_state())


def parity_inputs(module: Windowed | Stateful, n: int, seed: int) -> list[tuple[Tensor, ...]]:
    """The inputs of n check calls, without state: n independent (codes, history) windows
    (windowed; codes.check_history cycles partial, full and no history) or n consecutive (codes,)
    chunks of one stream (stateful)."""
    _, q, t = module.input_specs()[0].shape
    codes = check_windows(q, t, module.decoder.config.codebook_size, n, seed)
    if isinstance(module, Windowed):
        return [(c, check_history(module.context, i, seed)) for i, c in enumerate(codes)]
    return [(c,) for c in codes]
