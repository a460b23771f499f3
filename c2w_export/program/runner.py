"""Loaded programs behind checked calls.

`Runner`: one loaded program plus its method specs; every call is checked against the spec before
the runtime sees it, and runtime failures come back as one clear error type. `Dispatch`: one
`run(method, inputs)` over several runners (one program per chunk, or one multi-method file).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import Tensor

from ..model.validate import InputError, check_codes, check_tensor, first_non_finite
from .flows import FlowError, Loaded
from .variants import HISTORY, MethodSpec


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
        check_codes(inputs[0], codes_spec.shape[1], self.codebook_size)
        chunk = inputs[0].shape[2] - spec.context
        if chunk not in spec.chunks:  # refused here: the runtime would resize past its planned memory
            where = f" after its {spec.context} frames of context" if spec.context else ""
            raise InputError(f"{method} takes chunks of {spec.min_chunk}..{spec.max_chunk} frames{where}; codes of "
                             f"T={inputs[0].shape[2]} frames are a chunk of {chunk}")
        for x, s in zip(inputs[1:], spec.inputs[1:]):
            if s.name == HISTORY:
                check_tensor(x, f"input '{HISTORY}'", s.shape, s.torch_dtype)
                if not 0 <= int(x[0]) <= spec.context:
                    raise InputError(f"{method}: input '{HISTORY}' must be 0..{spec.context} (real frames of "
                                     f"history in the window), got {int(x[0])}")
            else:
                check_tensor(x, f"state '{s.name}'", s.shape, s.torch_dtype)

    def run(self, method: str, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        self.check(method, inputs)
        inputs = [x.contiguous() for x in inputs]  # ExecuTorch refuses strided views (stream slices)
        spec = self.specs[method]
        try:
            out = self.loaded.run(method, inputs)
        except Exception as e:
            raise FlowError(f"{self.flow}: method {method}{_of(self.loaded)} failed in its runtime on a chunk of "
                            f"{inputs[0].shape[2] - spec.context} (of {spec.min_chunk}..{spec.max_chunk}): "
                            f"{type(e).__name__}: {e}") from e
        if len(out) != len(spec.outputs):
            raise FlowError(f"{self.flow}: method {method} returned {len(out)} outputs, its spec says {len(spec.outputs)}")
        for y, s in zip(out, spec.outputs):  # audio for an ear, or the state of the next call: never nan or inf
            idx = first_non_finite(y) if y.is_floating_point() else None
            if idx is not None:
                raise FlowError(f"{self.flow}: method {method}{_of(self.loaded)} returned a "
                                f"non-finite value ({float(y[idx])}) in output '{s.name}' at index {idx} (from values its inputs "
                                f"overflow, or a damaged program)")
        return out


def _of(loaded: Loaded) -> str:
    """' of <file>' when the program knows the file it was loaded from, for messages."""
    source = getattr(loaded, "source", "")
    return f" of {source}" if source else ""


def warm_up_inputs(spec: MethodSpec) -> list[Tensor]:
    """A valid call of `spec` at its largest chunk: code 0 everywhere, a full history (windowed),
    the zero start state (stateful)."""
    codes = torch.zeros(spec.inputs[0].shape, dtype=torch.int64)
    rest = [torch.full(s.shape, spec.context, dtype=s.torch_dtype) if s.name == HISTORY
            else torch.zeros(s.shape, dtype=s.torch_dtype) for s in spec.inputs[1:]]
    return [codes, *rest]


class Dispatch:
    """run(method, inputs) over several runners, each serving the methods of its program."""

    def __init__(self, runners: Mapping[str, Runner]):
        self.runners = dict(runners)  # method -> the runner of the program holding it

    @property
    def methods(self) -> list[str]:
        return sorted(self.runners)

    def preload(self, warm: bool = True) -> None:
        """Load every method now (cold start) and, with `warm`, run each once at its largest chunk
        (warm_up_inputs), so the first call of a stream costs a warm call: the runtime's first call
        of a method sets up what later calls reuse (at real size ~2.7x a warm call)."""
        for runner in {id(r): r for r in self.runners.values()}.values():
            try:
                runner.loaded.preload([m for m, r in self.runners.items() if r is runner])
            except Exception as e:
                raise FlowError(f"{runner.flow}: loading methods{_of(runner.loaded)} failed: "
                                f"{type(e).__name__}: {e}") from e
        if warm:
            for method, runner in self.runners.items():
                runner.run(method, warm_up_inputs(runner.specs[method]))

    def run(self, method: str, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        if method not in self.runners:
            raise FlowError(f"no program for method {method!r}; have {sorted(self.runners)}")
        return self.runners[method].run(method, inputs)
