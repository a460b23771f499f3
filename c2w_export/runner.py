"""A loaded program plus its specs: every call is checked against the spec before the runtime
sees it, and runtime failures come back as one clear error type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from torch import Tensor

from .flows import FlowError, Loaded
from .validate import InputError, check_codes, check_tensor
from .variants import TensorSpec


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
    return f"chunk_{chunk}" if variant == "windowed" else f"stateful_chunk_{chunk}"


class Runner:
    """`run(method, inputs)` with input checks; `flow` names the backend in errors."""

    def __init__(self, flow: str, loaded: Loaded, specs: Mapping[str, MethodSpec], codebook_size: int):
        self.flow, self.loaded, self.specs, self.codebook_size = flow, loaded, dict(specs), codebook_size
        absent = sorted(set(self.specs) - set(loaded.methods))
        if absent:
            raise FlowError(f"{flow}: program has no method(s) {absent}; it has {sorted(loaded.methods)}")

    def check(self, method: str, inputs: Sequence[Tensor]) -> None:
        if method not in self.specs:
            raise InputError(f"unknown method {method!r}; this program has {sorted(self.specs)}")
        spec = self.specs[method]
        if len(inputs) != len(spec.inputs):
            raise InputError(f"{method} takes {len(spec.inputs)} inputs ({', '.join(s.name for s in spec.inputs)}), got {len(inputs)}")
        codes_spec = spec.inputs[0]
        check_codes(inputs[0], codes_spec.shape[1], self.codebook_size, codes_spec.shape[2])
        for x, s in zip(inputs[1:], spec.inputs[1:]):
            check_tensor(x, f"state '{s.name}'", s.shape, s.torch_dtype)

    def run(self, method: str, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        self.check(method, inputs)
        inputs = [x.contiguous() for x in inputs]  # ExecuTorch refuses strided views (stream slices)
        try:
            out = self.loaded.run(method, inputs)
        except Exception as e:
            raise FlowError(f"{self.flow}: method {method} failed in its runtime: {type(e).__name__}: {e}") from e
        want = len(self.specs[method].outputs)
        if len(out) != want:
            raise FlowError(f"{self.flow}: method {method} returned {len(out)} outputs, its spec says {want}")
        return out
