"""The exporter's core: run a flow's stages in order for every variant's program and compare
each comparable stage's artifact, and finally the loaded program, with the eager variant module on
the same inputs, so a failure says which stage diverged. The serialize stage writes files and is
judged through the load that follows it (the "run" diff)."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import Tensor

from ..model.decoder import Code2Wav
from .compare import Diff, combine, compare
from .flows import RUN, Flow, FlowError, Loaded, Work
from .native_fp16 import emulated
from .precision import PRECISIONS
from .runner import Runner
from .tolerances import Tolerance, tolerance
from .variants import MethodSpec, Stateful, Windowed, make_variant, parity_inputs  # noqa: F401 (parity_inputs: re-exported)

RunFn = Callable[[str, Sequence[Tensor]], tuple[Tensor, ...]]
QUALITY = "quality"  # reduced precision: the loaded program against the fp32 eager decoder (gate side 2)
# fp16: its own reference run with native fp16 arithmetic (emulated, native_fp16.py) against the fp32 eager
# decoder, at the same floor: the quality a phone gets, judged on every CPU
NATIVE = "quality-native-fp16"


class ParityError(RuntimeError):
    """A program is over tolerance: it must not ship."""


@dataclass
class ProgramResult:
    flow: str
    spec: MethodSpec
    path: Path | None
    tolerance: Tolerance
    stages: dict[str, Diff] = field(default_factory=dict)  # stage name (or RUN) -> diff against eager
    windows: int = 0  # code windows (windowed) or stream steps (stateful) checked at the run stage
    module: Windowed | Stateful | None = None  # the eager variant module this program was exported from
    seconds: dict[str, float] = field(default_factory=dict)  # stage name -> seconds, shared evenly per method
    bytes: int = 0
    nodes: int = 0  # operator nodes of the exported graph (0: not exported)
    delegation: dict = field(default_factory=dict)  # flows.delegation() of the lowered graph (ExecuTorch)
    plan_bytes: int = 0  # ExecuTorch: the method's memory plan (flows.memory_plan; 0: no plan)
    precision: str = "fp32"
    gates: dict[str, Tolerance] = field(default_factory=dict)  # stage -> its gate when not `tolerance`
    references: dict[str, str] = field(default_factory=dict)  # stage -> what it was compared with
    own: Callable | None = None  # reduced precision: the own reference (a variant module or precision.OwnModule)

    @property
    def diff(self) -> Diff:
        return self.stages[RUN]

    @property
    def quality(self) -> Diff | None:
        """Reduced precision: the loaded program against the fp32 eager decoder."""
        return self.stages.get(QUALITY)

    def gate(self, stage: str) -> Tolerance:
        return self.gates.get(stage, self.tolerance)

    @property
    def passed(self) -> bool:
        return all(d.within(self.gate(s)) for s, d in self.stages.items())

    def failure(self) -> str:
        bad = [f"stage '{s}' diverged from {self.references.get(s, 'the reference')}: {d.describe()} (tolerance "
               f"max_abs<={self.gate(s).max_abs:g}, SNR>={self.gate(s).min_snr_db:g} dB)"
               for s, d in self.stages.items() if not d.within(self.gate(s))]
        precision = "" if self.precision == "fp32" else f" {self.precision}"
        return f"{self.flow}{precision} {self.spec.method}: " + "; ".join(bad)


def check_method(run: RunFn, reference: Windowed | Stateful, method: str, calls: Sequence[tuple[Tensor, ...]],
                 state: Sequence[Tensor] | None = None) -> Diff:
    """Run each call's inputs (parity_inputs) through `run` and through the `reference` module;
    diff of the wav outputs. Stateful: the calls are consecutive chunks, each side feeding back its
    own state; `run` starts from `state` (default: the reference's initial state, when both share a
    dtype)."""
    diffs = []
    ref_state = reference.initial_state()
    cand_state = tuple(state) if state is not None else ref_state
    for c in calls:
        with torch.no_grad():
            ref = reference(*c, *ref_state)
        ref = ref if isinstance(ref, tuple) else (ref,)
        out = run(method, (*c, *cand_state))
        diffs.append(compare(out[0], ref[0]))
        ref_state, cand_state = tuple(ref[1:]), tuple(out[1:])
    return combine(diffs)


HEARTBEAT_SECONDS = 30.0


@contextlib.contextmanager
def heartbeat(progress: Callable[[str], None], label: str, every: float = HEARTBEAT_SECONDS):
    """A line every `every` seconds while a long step runs, so a terminal never sits silent."""
    start, done = time.perf_counter(), threading.Event()

    def beat():
        while not done.wait(every):
            progress(f"      ... {label}: {time.perf_counter() - start:.0f}s")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def reference_decoder(decoder: Code2Wav, flow: Flow) -> Code2Wav:
    """What `flow`'s programs are compared with: `decoder` itself, or a copy in the flow's
    reference dtype (fp64 for the eager flow)."""
    if decoder.dtype == flow.reference_dtype:
        return decoder
    return copy.deepcopy(decoder).to(flow.reference_dtype)


def build(decoder: Code2Wav, flow: Flow, variants: Sequence[str], max_chunk: int, context: int,
          out_dir: Path | None, *, multi_method: bool = False, windows: int = 3, seed: int = 0,
          stem: str = "code2wav", progress: Callable[[str], None] = lambda s: None,
          reference: Code2Wav | None = None, gate: str | None = None
          ) -> tuple[list[ProgramResult], dict[str, Loaded]]:
    """Run `flow`'s stages for every variant's program of `decoder` (one method each, any chunk
    1..max_chunk) and check each against
    the reference (default: `reference_decoder(decoder, flow)`; pass the checkpoint's decoder
    when `decoder` is a modified copy), at the tolerance `gate` names (default: the flow's).

    Comparable stages are checked on the first window (at max_chunk, the size export traces); the
    loaded program (RUN) on all `windows`, whose chunk sizes cycle through the max, 1 and one drawn
    between (parity_inputs), through a Runner so its input checks are exercised too. Returns the results and {method:
    loaded program}. Raises FlowError when a stage cannot run; parity is judged by the caller."""
    reference = reference if reference is not None else reference_decoder(decoder, flow)
    modules = {m.method: m for m in (make_variant(decoder, v, max_chunk, context) for v in variants)}
    refs = {m: make_variant(reference, modules[m].variant, max_chunk, context) for m in modules}
    groups = [list(modules)] if multi_method else [[m] for m in modules]
    tol = tolerance(gate or flow.name)
    key = PRECISIONS[flow.precision].key  # the tolerance table's key of the flow's precision
    results, loaded_by_method = [], {}
    for group in groups:
        t0 = time.perf_counter()
        mods = {m: modules[m] for m in group}
        inputs = {m: parity_inputs(mods[m], windows, seed) for m in group}
        work = Work(dict(mods), {m: (*inputs[m][0], *mods[m].initial_state()) for m in group}, out_dir,
                    stem if multi_method else f"{stem}_{group[0]}", progress=progress)
        res = {m: ProgramResult(flow.name, mods[m].spec(), None, tol, windows=windows, module=mods[m],
                                precision=flow.precision) for m in group}
        # what the stages are compared with, at which gate
        eager = f"the {str(reference.dtype).removeprefix('torch.')} eager decoder"
        against, current, name = dict(refs), tol, eager
        artifact, seconds = mods, {}
        for stage in flow.stages:
            t = time.perf_counter()
            try:
                with heartbeat(progress, f"{flow.name} {stage.name} {', '.join(group)}"):
                    artifact = stage.run(artifact, work)
            except FlowError:
                raise
            except Exception as e:
                raise FlowError(f"{flow.name}: stage '{stage.name}' failed for {group}: {type(e).__name__}: {e}") from e
            seconds[stage.name] = time.perf_counter() - t
            if stage.own_reference:  # what is lost here is the precision's quality budget (side 2)
                current = tolerance(QUALITY, key)
            if stage.compared:
                try:
                    program = stage.program(artifact)
                    for m in group:
                        res[m].stages[stage.name] = check_method(program.run, against[m], m, inputs[m][:1],
                                                                 mods[m].initial_state())
                        res[m].gates[stage.name], res[m].references[stage.name] = current, name
                except FlowError:
                    raise
                except Exception as e:  # e.g. the runtime cannot load what the stage lowered
                    raise FlowError(f"{flow.name}: stage '{stage.name}' output could not run for {group}: "
                                    f"{type(e).__name__}: {e}") from e
            if stage.own_reference:  # later stages: against this artifact, at the flow's gate for the precision (side 1)
                against = stage.references(artifact, work)
                current, name = tolerance(flow.name, key), f"its own {flow.precision} eager reference"
                for m in group:
                    res[m].own, res[m].tolerance = against[m], current
        loaded = artifact  # the last stage is always load (Flow checks the order)
        runner = Runner(flow.name, loaded, {m: res[m].spec for m in group}, decoder.config.codebook_size)
        for m in group:
            r = res[m]
            r.stages[RUN] = check_method(runner.run, against[m], m, inputs[m], mods[m].initial_state())
            r.references[RUN] = name
            if r.own is not None:
                r.stages[QUALITY] = check_method(runner.run, refs[m], m, inputs[m], mods[m].initial_state())
                r.gates[QUALITY], r.references[QUALITY] = tolerance(QUALITY, key), eager
            if r.own is not None and PRECISIONS[flow.precision].half:
                with heartbeat(progress, f"{flow.name} {m}: quality with native fp16 arithmetic (emulated)"):
                    r.stages[NATIVE] = check_method(emulated(r.own), refs[m], m, inputs[m], mods[m].initial_state())
                r.gates[NATIVE] = tolerance(QUALITY, key)
                r.references[NATIVE] = f"{eager} (its own reference with native fp16 arithmetic, emulated)"
            r.path = work.paths.get(m)
            r.bytes = r.path.stat().st_size if r.path else 0
            r.seconds = {s: v / len(group) for s, v in seconds.items()}
            r.nodes = work.nodes.get(m, 0)
            r.delegation = work.delegation.get(m, {})
            r.plan_bytes = work.plan.get(m, 0)
            loaded_by_method[m] = loaded
            results.append(r)
            status = "ok" if r.passed else "OVER TOLERANCE"
            quality = f", vs fp32 {r.quality.describe()}" if r.quality else ""
            if NATIVE in r.stages:
                quality += f", with native fp16 arithmetic (emulated) {r.stages[NATIVE].describe()}"
            stage_times = ", ".join(f"{s} {v:.1f}s" for s, v in seconds.items() if v >= 0.05)
            graph = f"{r.nodes} graph nodes" + (
                f" ({r.delegation['partitions']} delegate partitions, {r.delegation['outside_ops']} ops outside, "
                f"{r.delegation['between_ops']} between partitions)"
                if r.delegation else "")
            progress(f"[{len(results)}/{len(modules)}] {flow.name} {m} (chunks {r.spec.min_chunk}..{r.spec.max_chunk}): "
                     f"{time.perf_counter() - t0:.1f}s ({stage_times}), {graph}, "
                     f"{r.bytes / 1e6:.1f} MB{f', memory plan {r.plan_bytes / 1e6:.1f} MB' if r.plan_bytes else ''}, "
                     f"{r.diff.describe()}{quality} -> {status}")
    return results, loaded_by_method
