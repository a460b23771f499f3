"""Backends as data: a `Flow` says how to build, save, load and run a program, and why it is
skipped. Every artifact flow is executed in its own runtime (never just lowered).

Stages, in the only allowed order: export -> lower -> serialize -> run. `lower` is a no-op for
torch_export; eager has no stages and runs the module itself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from .fileio import atomic_write

class FlowError(RuntimeError):
    """A flow could not build, load or run a program; the message names the flow, method and stage."""


def _missing(module: str, extra: str) -> Callable[[], str | None]:
    def reason() -> str | None:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'c2w-export[{extra}]')"
        return None
    return reason


@dataclass(frozen=True)
class Flow:
    name: str
    suffix: str  # artifact file suffix; "" for eager
    partitioner: str | None  # ExecuTorch partitioner, if any
    verified: bool  # executed and parity-checked by this project
    skip_reason: Callable[[], str | None] = field(default=lambda: None, compare=False)
    description: str = ""

    @property
    def is_executorch(self) -> bool:
        return self.suffix == ".pte"


FLOWS: dict[str, Flow] = {
    f.name: f for f in (
        Flow("eager", "", None, True, description="the PyTorch module itself"),
        Flow("torch_export", ".pt2", None, True, description="torch.export.export, saved .pt2, torch.export.load, run"),
        Flow("executorch_xnnpack", ".pte", "xnnpack", True, _missing("executorch", "executorch"),
             "to_edge_transform_and_lower + XnnpackPartitioner, run by executorch.runtime"),
        Flow("executorch_portable", ".pte", None, True, _missing("executorch", "executorch"),
             "to_edge, no delegate (portable kernels), run by executorch.runtime"),
    )
}


def get_flow(name: str) -> Flow:
    if name not in FLOWS:
        raise FlowError(f"unknown flow {name!r}; choose from {sorted(FLOWS)}")
    return FLOWS[name]


# ---------------------------------------------------------------- stages
def export_stage(modules: Mapping[str, nn.Module], inputs: Mapping[str, tuple]) -> dict[str, "torch.export.ExportedProgram"]:
    """{method: module} -> {method: ExportedProgram}, static shapes from the example inputs."""
    out = {}
    for method, module in modules.items():
        try:
            with torch.no_grad():
                out[method] = torch.export.export(module, tuple(inputs[method]), strict=False)
        except Exception as e:
            raise FlowError(f"stage 'export' failed for method {method}: {type(e).__name__}: {e}") from e
    return out


def lower_stage(flow: Flow, programs: Mapping[str, "torch.export.ExportedProgram"]):
    """ExecuTorch: one program holding every method (weights shared by XNNPACK) -> .pte bytes.
    torch_export: the ExportedPrograms unchanged."""
    if not flow.is_executorch:
        return dict(programs)
    from executorch.exir import to_edge, to_edge_transform_and_lower

    try:
        if flow.partitioner == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            edge = to_edge_transform_and_lower(dict(programs), partitioner=[XnnpackPartitioner()])
        elif flow.partitioner is None:
            edge = to_edge(dict(programs))
        else:
            raise FlowError(f"partitioner {flow.partitioner!r} is not supported (xnnpack or none)")
        return edge.to_executorch().buffer
    except FlowError:
        raise
    except Exception as e:
        raise FlowError(f"stage 'lower' failed for flow {flow.name}: {type(e).__name__}: {e}") from e


def serialize_stage(flow: Flow, lowered, out_dir: Path, stem: str) -> dict[str, Path]:
    """Write the artifact(s) atomically -> {method: path}. A .pte holds all methods in one file;
    torch_export writes one .pt2 per method."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if flow.is_executorch:
        path = out_dir / f"{stem}{flow.suffix}"
        atomic_write(path, lambda f: f.write(lowered))
        return {m: path for m in _pte_methods(lowered)}
    paths = {}
    for method, ep in lowered.items():
        path = out_dir / f"{stem}.{method}{flow.suffix}" if len(lowered) > 1 else out_dir / f"{stem}{flow.suffix}"
        atomic_write(path, lambda f, ep=ep: torch.export.save(ep, f))
        paths[method] = path
    return paths


def _pte_methods(buffer: bytes) -> list[str]:
    from executorch.runtime import Runtime

    return sorted(Runtime.get().load_program(buffer).method_names)


# ---------------------------------------------------------------- loaded programs
class Loaded:
    """A program in its runtime: `run(method, inputs) -> tuple of tensors`. No input checks here;
    `runner.Runner` checks inputs against the specs before calling this."""

    methods: Sequence[str]

    def run(self, method: str, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        raise NotImplementedError


class EagerLoaded(Loaded):
    def __init__(self, modules: Mapping[str, nn.Module]):
        self.modules, self.methods = dict(modules), list(modules)

    def run(self, method, inputs):
        with torch.no_grad():
            out = self.modules[method](*inputs)
        return out if isinstance(out, tuple) else (out,)


class ExportLoaded(Loaded):
    def __init__(self, paths: Mapping[str, Path]):
        self.modules = {m: torch.export.load(str(p)).module() for m, p in paths.items()}
        self.methods = list(self.modules)

    def run(self, method, inputs):
        with torch.no_grad():
            out = self.modules[method](*inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class ExecuTorchLoaded(Loaded):
    def __init__(self, source: Path | bytes):
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(source if isinstance(source, bytes) else str(source))
        self.methods = sorted(self.program.method_names)
        self._methods: dict = {}

    def run(self, method, inputs):
        if method not in self._methods:
            self._methods[method] = self.program.load_method(method)
        out = self._methods[method].execute(list(inputs))
        return tuple(out)


def load(flow: Flow, paths: Mapping[str, Path] | None = None, *, buffer: bytes | None = None,
         modules: Mapping[str, nn.Module] | None = None) -> Loaded:
    """Load an artifact in the flow's own runtime (from files, or an in-memory .pte buffer)."""
    try:
        if flow.name == "eager":
            return EagerLoaded(modules or {})
        if flow.is_executorch:
            if buffer is not None:
                return ExecuTorchLoaded(buffer)
            files = sorted(set(paths.values()))
            if len(files) != 1:
                raise FlowError(f"an ExecuTorch artifact is one .pte file, got {files}")
            return ExecuTorchLoaded(files[0])
        return ExportLoaded(paths)
    except FlowError:
        raise
    except Exception as e:
        raise FlowError(f"{flow.name}: cannot load {dict(paths or {})}: {type(e).__name__}: {e}") from e
