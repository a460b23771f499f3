"""Backends as data. A `Flow` is a name plus its stages in order; `pipeline.build` runs them in a
straight loop, so adding a flow means adding an entry to FLOWS, not a branch.

A stage is a small object in the style of ExecuTorch's backend test harness: `run(artifact, work)`
turns the previous stage's artifact into the next one, and `program(artifact)` gives that artifact
in a runnable form when it can be compared with the eager reference (else None).

    prepare    {method: nn.Module}        -> the same, constants folded    compared (prepare.py)
    half       {method: nn.Module}        -> the same in float16           compared; the own reference (precision.py)
    quantize   {method: ExportedProgram}  -> the same, PT2E int8            compared; the own reference (precision.py)
    export     {method: nn.Module}        -> {method: ExportedProgram}     compared
    lower      {method: ExportedProgram}  -> .pte bytes (all methods)      compared (in-memory runtime)
    serialize  .pte bytes or programs     -> {method: file path}           (files: compared once loaded)
    load       files (or eager modules)   -> Loaded                        run and compared as "run"

The allowed order is the table NEXT; a Flow whose stages break it fails when it is made, naming
the stage. Every artifact flow ends by loading its files in its own runtime: nothing is only lowered.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import operator
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from ..fileio import atomic_write


class FlowError(RuntimeError):
    """A flow could not build, load or run a program; the message names the flow, method and stage."""


QUIET_NATIVE = False  # the CLI sets this: the runtime's native start-up lines (cpuinfo) are kept off stderr
NATIVE_LOG: list[str] = []  # what the runtime printed natively while it was kept quiet
_CAPTURE = None  # native_quiet's file
EXECUTORCH_RAN = False  # this process has loaded an ExecuTorch method: a fork of it would hang there (ship/probe.py)


@contextlib.contextmanager
def native_quiet():
    """With QUIET_NATIVE, what native code prints to stderr meanwhile (the runtime's cpuinfo
    probing when XNNPACK starts) goes to NATIVE_LOG instead of the terminal."""
    if not QUIET_NATIVE:
        yield
        return
    global _CAPTURE
    if _CAPTURE is None:  # one file for the process: this wraps every call of a program (~10 us each)
        _CAPTURE = tempfile.TemporaryFile()
    sys.stderr.flush()
    saved, python_stderr = os.dup(2), sys.stderr
    os.dup2(_CAPTURE.fileno(), 2)
    sys.stderr = io.StringIO()  # the runtime's log may also come through Python's sys.stderr
    try:
        yield
    finally:
        text = sys.stderr.getvalue()
        sys.stderr = python_stderr
        os.dup2(saved, 2)
        os.close(saved)
        if _CAPTURE.tell():
            _CAPTURE.seek(0)
            text += _CAPTURE.read().decode(errors="replace")
            _CAPTURE.seek(0)
            _CAPTURE.truncate()
        if text:
            NATIVE_LOG.append(text)
            del NATIVE_LOG[:-100]  # the latest; a long process must not keep every line


def runtime():
    """The ExecuTorch runtime (executorch.runtime.Runtime.get())."""
    with native_quiet():
        from executorch.runtime import Runtime

        return Runtime.get()


# ---------------------------------------------------------------- loaded programs
IoMeta = tuple[list[tuple[tuple, str]], list[tuple[tuple, str]]]
# ExecuTorch's ScalarType codes (runtime/core/portable_type/scalar_type.h) of the dtypes a manifest may name
_SCALAR_TYPES = {0: "uint8", 1: "int8", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
                 11: "bool", 15: "bfloat16"}


class Loaded:
    """A program in its runtime: `run(method, inputs) -> tuple of tensors`. No input checks here;
    `runner.Runner` checks inputs against the specs before calling this."""

    methods: Sequence[str]
    source: str = ""  # the file(s) it was loaded from, for messages

    def run(self, method: str, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def preload(self, methods: Sequence[str]) -> None:
        """Make `methods` ready to run (a runtime that loads lazily does its work here)."""

    def io_meta(self, method: str) -> IoMeta | None:
        """What the program itself says `method` takes and returns, without running it: (inputs,
        outputs), each a list of (shape at the largest size, a dim None where it does not say; dtype
        name). None when the program carries no such metadata (eager modules)."""
        return None


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class ModuleLoaded(Loaded):
    """Callables run by PyTorch: the eager variant modules, or `ExportedProgram.module()`s."""

    def __init__(self, modules: Mapping[str, Callable]):
        self.modules, self.methods = dict(modules), list(modules)

    def run(self, method, inputs):
        with torch.no_grad():
            return _as_tuple(self.modules[method](*inputs))


class ExecuTorchLoaded(Loaded):
    """A .pte (path or bytes) in the ExecuTorch runtime; methods load on preload() or their first call."""

    def __init__(self, source: Path | bytes):
        self.source = "a .pte buffer" if isinstance(source, bytes) else str(source)
        with native_quiet():  # the runtime logs why a program does not load; the error says it in one line
            self.program = runtime().load_program(source if isinstance(source, bytes) else str(source))
        self.methods = sorted(self.program.method_names)
        self._methods: dict = {}

    def preload(self, methods):
        global EXECUTORCH_RAN
        for method in methods:
            if method not in self._methods:  # loading a method initialises its delegates (XNNPACK packs the weights)
                EXECUTORCH_RAN = True
                with native_quiet():
                    self._methods[method] = self.program.load_method(method)

    def run(self, method, inputs):
        self.preload([method])
        with native_quiet():
            return tuple(self._methods[method].execute(list(inputs)))

    def io_meta(self, method):
        """From the .pte's method metadata (read without loading the method): sizes are the upper
        bounds memory is planned for."""
        meta = self.program.metadata(method)
        side = lambda n, get: [(tuple(get(i).sizes()), _SCALAR_TYPES.get(int(get(i).dtype()), f"ScalarType {int(get(i).dtype())}"))
                               for i in range(n)]
        return side(meta.num_inputs(), meta.input_tensor_meta), side(meta.num_outputs(), meta.output_tensor_meta)


class Pt2Loaded(ModuleLoaded):
    """torch.export programs (.pt2), run as `ExportedProgram.module()`."""

    def __init__(self, programs: Mapping[str, "torch.export.ExportedProgram"]):
        # check_guards=False: the input ranges are still checked (a pre-hook), not guards such as a
        # conv's memory-format choice at 1 frame (Ne(t, 1)), which do not change the values; the gate
        # checks chunk 1 against eager
        super().__init__({m: ep.module(check_guards=False) for m, ep in programs.items()})
        self.programs = dict(programs)

    def io_meta(self, method):
        """From the graph's placeholders and outputs: a dynamic dim is None."""
        ep = self.programs[method]
        nodes = {n.name: n for n in ep.graph.nodes}
        out_node = next(n for n in ep.graph.nodes if n.op == "output")
        user_out = ep.graph_signature.user_outputs
        outs = [a for a in out_node.args[0] if getattr(a, "name", None) in user_out]
        side = lambda ns: [(tuple(d if isinstance(d, int) else None for d in n.meta["val"].shape),
                            str(n.meta["val"].dtype).removeprefix("torch.")) for n in ns]
        return side([nodes[i] for i in ep.graph_signature.user_inputs]), side(outs)


# ---------------------------------------------------------------- stages
@dataclass
class Work:
    """What the stages of one program read: its eager modules, one example input per method (for
    export), and where its files go. `paths` is filled by the serialize stage."""

    modules: dict[str, nn.Module]
    inputs: dict[str, tuple]
    out_dir: Path | None
    stem: str
    paths: dict[str, Path] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)  # method -> operator nodes of its exported graph
    delegation: dict[str, dict] = field(default_factory=dict)  # method -> delegation(), after lowering
    plan: dict[str, int] = field(default_factory=dict)  # method -> bytes of its memory plan (memory_plan)
    progress: Callable[[str], None] = lambda s: None  # per-method lines of long stages (lowering)

    def directory(self) -> Path:
        if self.out_dir is None:  # an in-memory build still runs the files through the runtime
            self.out_dir = Path(tempfile.mkdtemp(prefix="c2w-"))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self.out_dir


class Stage:
    name: str = ""
    compared: bool = False  # True when `program` gives a runnable artifact to compare with eager
    own_reference: bool = False  # True: its artifact ({method: module}) is what later stages are compared with

    def run(self, artifact: Any, work: Work) -> Any:
        raise NotImplementedError

    def program(self, artifact: Any) -> Loaded | None:
        """The artifact in a runnable form, to compare with eager; None when it is not comparable."""
        return None

    def references(self, artifact: Any, work: Work) -> dict:
        """own_reference stages: {method: the eager module later stages are compared with}."""
        raise NotImplementedError


class Prepare(Stage):
    """Fold inference constants into buffers (program/prepare.py) before export."""

    name = "prepare"
    compared = True

    def run(self, modules, work):
        from .prepare import prepare
        from .variants import make_variant

        prepared: dict[int, nn.Module] = {}  # one prepared copy per decoder
        out = {}
        for method, m in modules.items():
            if id(m.decoder) not in prepared:
                prepared[id(m.decoder)] = prepare(m.decoder)
            out[method] = make_variant(prepared[id(m.decoder)], m.variant, m.max_chunk, m.context)
        return out

    def program(self, modules):
        return ModuleLoaded(modules)


class Export(Stage):
    name = "export"
    compared = True

    def run(self, modules, work):
        from .variants import export_variant

        out = {}
        for method, module in modules.items():
            try:
                out[method] = export_variant(module, work.inputs[method])  # one method, every chunk size
                work.nodes[method] = sum(n.op == "call_function" for n in out[method].graph.nodes)
            except Exception as e:
                raise FlowError(f"stage 'export' failed for method {method}: {type(e).__name__}: {e}") from e
        return out

    def program(self, programs):
        return Pt2Loaded(programs)


def op_name(node) -> str:
    """A graph node's operator without namespace and overload: "add" for aten::add.Tensor (edge ops
    wrap their aten overload), "executorch_call_delegate" for a delegate call."""
    name = getattr(node.target, "__name__", str(node.target))
    if name == "executorch_call_delegate":
        return name
    target = node.target  # an aten op (a dynamic size's scalar_tensor) as it is; an edge op wraps its aten op
    if not isinstance(target, torch._ops.OpOverload):
        target = getattr(target, "_op", target)
    full = target.name() if callable(getattr(target, "name", None)) else str(target)  # "aten::add.Tensor"
    return full.split("::")[-1].split(".")[0]


def is_shape_op(node) -> bool:
    """A node that computes a size, not a tensor: a dynamic dim read (sym_size) or integer
    arithmetic on sizes (SymInt add, mul, ...). It runs as a scalar instruction between kernels."""
    val = node.meta.get("val")
    return not isinstance(val, torch.Tensor) and isinstance(val, (torch.SymInt, int))


def memory_plan(program) -> dict[str, int]:
    """{method: bytes of its memory plan} of an ExecuTorch program (`executorch_program` of a program
    manager, what the .pte serializes): the non-constant buffers memory planning laid out for the
    method's activations, inputs, outputs and what stays outside the delegate, at the upper bound of
    every dynamic axis (the runtime allocates them when the method loads; XNNPACK's own workspace and
    packed weights come on top). Nothing is run or parsed."""
    return {p.name: sum(p.non_const_buffer_sizes[1:]) for p in program.execution_plan}  # [0] is reserved


def delegation(graph) -> dict:
    """Delegation coverage of a lowered graph: how many delegate calls (partitions) it makes, which
    tensor operators stay outside them (portable kernels), with counts; how many of those sit
    between two delegate calls (`between_ops`: fed by one, feeding another, so they split the
    graph: a delegated-whole program has none; the others prepare the inputs or copy the state
    out), how many size computations of a dynamic chunk run between kernels (`shape_ops`), and how
    many of the graph's outputs an op outside the delegate computes (`outputs_outside`: a stateful
    method's position is one; a state update outside the delegate is one more)."""
    calls = [n for n in graph.nodes if n.op == "call_function"]
    ops = {n: op_name(n) for n in calls}  # named once: delegation walks each node's inputs and users
    delegate = {n for n, op in ops.items() if op == "executorch_call_delegate"}
    partitions, outside, shape = len(delegate), {}, 0
    after: set = set()  # nodes that depend on a delegate's output
    tensor_ops = []
    for n in calls:
        if any(a in after or a in delegate for a in n.all_input_nodes):
            after.add(n)
        if n.target is operator.getitem or n in delegate:
            continue
        if is_shape_op(n):
            shape += 1
            continue
        outside[ops[n]] = outside.get(ops[n], 0) + 1
        tensor_ops.append(n)
    before: set = set()  # nodes a delegate depends on
    for n in reversed(list(graph.nodes)):
        if any(u in before or u in delegate for u in n.users):
            before.add(n)
    between = sum(n in after and n in before for n in tensor_ops)
    results = _outputs(graph)
    computed_outside = sum(1 for a in results if a.op == "call_function"
                           and not (a.target is operator.getitem and a.args[0] in delegate))
    return {"partitions": partitions, "outside_ops": sum(outside.values()), "between_ops": between, "shape_ops": shape,
            "outputs_outside": computed_outside,
            "outside": dict(sorted(outside.items(), key=lambda kv: (-kv[1], kv[0])))}


def _outputs(graph) -> list:
    """The nodes a graph returns, in order."""
    out = next(n for n in graph.nodes if n.op == "output")
    found: list = []
    torch.fx.node.map_arg(out.args[0], found.append)
    return found


@dataclass(frozen=True)
class Lower(Stage):
    """ExecuTorch: every method into one program (XNNPACK shares the weights) -> .pte bytes; each
    method lowered on its own, in parallel when it can (lowering.py)."""

    partitioner: str
    name: str = "lower"
    compared: bool = True

    def run(self, programs, work):
        from .lowering import lower_methods, to_executorch

        try:
            edge = lower_methods(dict(programs), self.partitioner, work.progress, QUIET_NATIVE)
            for method in programs:
                work.delegation[method] = delegation(edge.exported_program(method).graph)
            manager = to_executorch(edge, programs)
            work.plan.update(memory_plan(manager.executorch_program))
            return manager.buffer
        except Exception as e:
            raise FlowError(f"stage 'lower' failed ({self.partitioner}): {type(e).__name__}: {e}") from e

    def program(self, buffer):
        return ExecuTorchLoaded(buffer)


class SerializePte(Stage):
    """One .pte holding every method of the group."""

    name = "serialize"

    def run(self, buffer, work):
        path = work.directory() / f"{work.stem}.pte"
        atomic_write(path, lambda f: f.write(buffer))
        work.paths = {m: path for m in work.modules}
        return dict(work.paths)


class SerializePt2(Stage):
    """One .pt2 per method (torch.export.save holds one program)."""

    name = "serialize"

    def run(self, programs, work):
        root = work.directory()
        for method, ep in programs.items():
            path = root / (f"{work.stem}.{method}.pt2" if len(programs) > 1 else f"{work.stem}.pt2")
            atomic_write(path, lambda f, ep=ep: torch.export.save(ep, f))
            work.paths[method] = path
        return dict(work.paths)


@dataclass(frozen=True)
class Load(Stage):
    """Files -> a Loaded program in the flow's own runtime. `open` is also how shipped artifacts
    are opened (artifacts.Artifacts), so the gate and the user load the same way."""

    open: Callable[[Mapping[str, Path]], Loaded]
    name: str = "load"

    def run(self, paths, work):
        return self.open(paths)


def _open_pte(paths: Mapping[str, Path]) -> Loaded:
    files = sorted(set(paths.values()))
    if len(files) != 1:
        raise FlowError(f"an ExecuTorch artifact is one .pte file, got {files}")
    return ExecuTorchLoaded(files[0])


def _open_pt2(paths: Mapping[str, Path]) -> Loaded:
    from .pt2load import load

    loaded = Pt2Loaded({m: load(p) for m, p in paths.items()})
    loaded.source = ", ".join(sorted({str(p) for p in paths.values()}))
    return loaded


class LoadEager(Stage):
    """The eager modules themselves (no files)."""

    name = "load"

    def run(self, modules, work):
        return ModuleLoaded(modules)


# ---------------------------------------------------------------- flows
START = "start"
NEXT: dict[str, tuple[str, ...]] = {  # stage -> the stages allowed after it
    START: ("prepare", "export", "load"),
    "prepare": ("export", "half"),
    "half": ("export",),
    "export": ("lower", "serialize", "quantize"),
    "quantize": ("lower", "serialize"),
    "lower": ("serialize",),
    "serialize": ("load",),
    "load": (),
}
RUN = "run"  # the name of the final comparison: the loaded program run in its runtime


def _missing(module: str, extra: str) -> Callable[[], str | None]:
    def reason() -> str | None:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'c2w-export[{extra}]')"
        return None
    return reason


@dataclass(frozen=True)
class Flow:
    name: str
    backend: str  # the CLI's --backend
    partitioner: str | None  # the CLI's --partitioner (ExecuTorch flows only)
    stages: tuple[Stage, ...]
    unavailable: Callable[[], str | None] = field(default=lambda: None, compare=False)  # why it cannot run here
    # What a build compares with: the decoder in this dtype. Artifact flows are compared with the
    # fp32 eager decoder they were exported from; the eager flow *is* that decoder, so it is
    # compared with the fp64 decode (never with itself).
    reference_dtype: torch.dtype = torch.float32
    precision: str = "fp32"  # precision.PRECISIONS: set by precision.with_precision with its stage

    def __post_init__(self) -> None:
        prev = START
        for s in self.stages:
            if s.name not in NEXT[prev]:
                raise FlowError(f"flow {self.name}: stage '{s.name}' cannot follow '{prev}' (allowed: {NEXT[prev]})")
            prev = s.name
        if prev != "load":
            raise FlowError(f"flow {self.name}: the last stage must be 'load', got '{prev}'")

    @property
    def compared(self) -> list[str]:
        """Names of the diffs a build records: every stage with a runnable artifact, then RUN."""
        return [s.name for s in self.stages if s.compared] + [RUN]

    @property
    def writes_files(self) -> bool:
        return any(s.name == "serialize" for s in self.stages)

    def open(self, paths: Mapping[str, Path]) -> Loaded:
        """Load shipped files in this flow's runtime; errors name the flow and the files."""
        last = self.stages[-1]
        if not isinstance(last, Load):
            raise FlowError(f"{self.name} has no files to load")
        try:
            return last.open(paths)
        except FlowError:
            raise
        except Exception as e:
            files = ", ".join(sorted({str(p) for p in paths.values()}))
            raise FlowError(f"{self.name}: cannot load {files}: {type(e).__name__}: {e}") from e


FLOWS: dict[str, Flow] = {f.name: f for f in (
    Flow("eager", "eager", None, (LoadEager(),), reference_dtype=torch.float64),
    Flow("torch_export", "torch_export", None, (Prepare(), Export(), SerializePt2(), Load(_open_pt2))),
    Flow("executorch_xnnpack", "executorch", "xnnpack",
         (Prepare(), Export(), Lower("xnnpack"), SerializePte(), Load(_open_pte)), _missing("executorch", "executorch")),
    Flow("executorch_portable", "executorch", "portable",
         (Prepare(), Export(), Lower("portable"), SerializePte(), Load(_open_pte)), _missing("executorch", "executorch")),
)}
REFERENCE_FLOW = "eager"  # the module itself: what every artifact flow is compared with


def get_flow(name: str) -> Flow:
    if name not in FLOWS:
        raise FlowError(f"unknown flow {name!r}; choose from {sorted(FLOWS)}")
    return FLOWS[name]


def flow_for(backend: str, partitioner: str | None = None) -> Flow:
    """The artifact flow for the CLI's --backend / --partitioner (the partitioner is ignored by a
    backend that has only one flow)."""
    if backend == REFERENCE_FLOW:
        raise FlowError("eager is the reference, not an artifact backend; use torch_export or executorch")
    matches = [f for f in FLOWS.values() if f.backend == backend]
    if not matches:
        backends = sorted({f.backend for f in FLOWS.values() if f.writes_files})
        raise FlowError(f"unknown backend {backend!r}; choose from {backends}")
    if len(matches) == 1:
        return matches[0]
    for f in matches:
        if f.partitioner == partitioner:
            return f
    raise FlowError(f"backend {backend} has no partitioner {partitioner!r}; choose from {sorted(f.partitioner for f in matches)}")
