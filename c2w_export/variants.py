"""Export variants: the I/O contracts that ship.

- windowed (stateless): codes int64 [1, Q, context + chunk] -> wav float32 [1, chunk * hop], the
  audio of the last `chunk` frames only. Recomputes `context` frames every call.
- stateful: (codes int64 [1, Q, chunk], *state) -> (wav float32 [1, chunk * hop], *new_state).
  State order and shapes are `Code2Wav.state_spec()`; nothing is mutated in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .decoder import Code2Wav

VARIANTS = ("windowed", "stateful")


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


def _dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


class Windowed(nn.Module):
    """codes int64 [1, Q, context + chunk] -> wav [1, chunk * hop]."""

    def __init__(self, decoder: Code2Wav, chunk: int, context: int):
        super().__init__()
        self.decoder, self.chunk, self.context = decoder, chunk, context

    def forward(self, codes: Tensor) -> Tensor:
        wav, _ = self.decoder.step(codes, self.decoder.initial_state())
        return wav[:, 0, self.context * self.decoder.config.hop:]

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec("codes", (1, self.decoder.config.num_quantizers, self.context + self.chunk), "int64")]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec("wav", (1, self.chunk * self.decoder.config.hop), _dtype_name(self.decoder.dtype))]

    def state_specs(self) -> list[TensorSpec]:
        return []


class Stateful(nn.Module):
    """(codes int64 [1, Q, chunk], *state) -> (wav [1, chunk * hop], *new_state)."""

    def __init__(self, decoder: Code2Wav, chunk: int):
        super().__init__()
        self.decoder, self.chunk, self.context = decoder, chunk, 0
        self.names = [n for n, _, _ in decoder.state_spec()]

    def forward(self, codes: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        wav, new = self.decoder.step(codes, dict(zip(self.names, state)))
        return (wav[:, 0], *(new[n] for n in self.names))

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec("codes", (1, self.decoder.config.num_quantizers, self.chunk), "int64"), *self.state_specs()]

    def output_specs(self) -> list[TensorSpec]:
        wav = TensorSpec("wav", (1, self.chunk * self.decoder.config.hop), _dtype_name(self.decoder.dtype))
        return [wav, *self.state_specs()]

    def state_specs(self) -> list[TensorSpec]:
        return [TensorSpec(n, s, _dtype_name(d)) for n, s, d in self.decoder.state_spec()]

    def initial_state(self) -> tuple[Tensor, ...]:
        init = self.decoder.initial_state()
        return tuple(init[n] for n in self.names)


def make_variant(decoder: Code2Wav, variant: str, chunk: int, context: int) -> nn.Module:
    if variant == "windowed":
        return Windowed(decoder, chunk, context).eval()
    if variant == "stateful":
        return Stateful(decoder, chunk).eval()
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


def example_inputs(module: nn.Module, codes: Tensor | None = None, seed: int = 0) -> tuple[Tensor, ...]:
    """Inputs matching the module's input specs: random codes (or `codes`) plus the initial state."""
    spec = module.input_specs()[0]
    if codes is None:
        g = torch.Generator().manual_seed(seed)
        codes = torch.randint(0, module.decoder.config.codebook_size, spec.shape, generator=g)
    if isinstance(module, Stateful):
        return (codes, *module.initial_state())
    return (codes,)
