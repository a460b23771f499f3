"""Loaded programs behind checked calls.

`Runner`: one loaded program plus its method specs; every call is checked against the spec before
the runtime sees it, and runtime failures come back as one clear error type. `Dispatch`: one
`run(method, inputs)` over several runners (one program per chunk, or one multi-method file).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from torch import Tensor

from ..model.validate import InputError, check_codes, check_tensor
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
        check_codes(inputs[0], codes_spec.shape[1], self.codebook_size, codes_spec.shape[2])
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
        try:
            out = self.loaded.run(method, inputs)
        except Exception as e:
            raise FlowError(f"{self.flow}: method {method} failed in its runtime: {type(e).__name__}: {e}") from e
        want = len(self.specs[method].outputs)
        if len(out) != want:
            raise FlowError(f"{self.flow}: method {method} returned {len(out)} outputs, its spec says {want}")
        return out


class Dispatch:
    """run(method, inputs) over several runners, each serving the methods of its program."""

    def __init__(self, runners: Mapping[str, Runner]):
        self.runners = dict(runners)  # method -> the runner of the program holding it

    @property
    def methods(self) -> list[str]:
        return sorted(self.runners)

    def preload(self) -> None:
        """Load every method now (cold start), so the first call of a stream is a warm one."""
        for runner in {id(r): r for r in self.runners.values()}.values():
            try:
                runner.loaded.preload([m for m, r in self.runners.items() if r is runner])
            except Exception as e:
                raise FlowError(f"{runner.flow}: loading methods failed: {type(e).__name__}: {e}") from e

    def run(self, method: str, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        if method not in self.runners:
            raise FlowError(f"no program for method {method!r}; have {sorted(self.runners)}")
        return self.runners[method].run(method, inputs)
