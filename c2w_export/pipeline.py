"""The exporter: export -> lower -> serialize -> run, each stage compared with the eager
reference on the same inputs, so a failure says which stage diverged."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import Tensor

from .codes import check_windows
from .compare import Diff, combine, compare
from .decoder import Code2Wav
from .flows import EagerLoaded, Flow, Loaded, export_stage, load, lower_stage, serialize_stage
from .runner import MethodSpec, Runner, method_name
from .tolerances import Tolerance, tolerance
from .variants import Stateful, make_variant


class ParityError(RuntimeError):
    """A program is over tolerance: it must not ship."""


@dataclass
class ProgramResult:
    flow: str
    spec: MethodSpec
    path: Path | None
    tolerance: Tolerance
    stages: dict[str, Diff] = field(default_factory=dict)  # stage -> diff against eager
    windows: int = 0  # code windows (windowed) or stream steps (stateful) checked at the run stage
    module: object = None  # the eager variant module this program was exported from
    seconds: dict[str, float] = field(default_factory=dict)
    bytes: int = 0

    @property
    def diff(self) -> Diff:
        return self.stages["run"]

    @property
    def passed(self) -> bool:
        return all(d.within(self.tolerance) for d in self.stages.values())

    def failure(self) -> str:
        bad = [f"stage '{s}' diverged from eager: {d.describe()}" for s, d in self.stages.items() if not d.within(self.tolerance)]
        return (f"{self.flow} {self.spec.method}: " + "; ".join(bad)
                + f" (tolerance max_abs<={self.tolerance.max_abs:g}, SNR>={self.tolerance.min_snr_db:g} dB)")


def method_spec(module, variant: str, chunk: int) -> MethodSpec:
    return MethodSpec(method_name(variant, chunk), variant, chunk, module.context,
                      tuple(module.input_specs()), tuple(module.output_specs()))


def parity_inputs(module, n: int, seed: int) -> list[Tensor]:
    """Code tensors for a check: n independent windows (windowed) or n consecutive chunks of one
    stream (stateful)."""
    spec = module.input_specs()[0]
    cfg = module.decoder.config
    return check_windows(spec.shape[1], spec.shape[2], cfg.codebook_size, n, seed)


def check_method(run: Callable[[str, Sequence[Tensor]], tuple[Tensor, ...]], module, method: str,
                 codes: Sequence[Tensor]) -> Diff:
    """Run `codes` through `run` and through the eager module; diff of the wav outputs.
    Stateful: the codes are consecutive chunks, each side feeding back its own state."""
    diffs = []
    if isinstance(module, Stateful):
        ref_state = cand_state = module.initial_state()
        for c in codes:
            with torch.no_grad():
                ref = module(c, *ref_state)
            out = run(method, (c, *cand_state))
            diffs.append(compare(out[0], ref[0]))
            ref_state, cand_state = tuple(ref[1:]), tuple(out[1:])
    else:
        for c in codes:
            with torch.no_grad():
                ref = module(c)
            diffs.append(compare(run(method, (c,))[0], ref))
    return combine(diffs)


def build(decoder: Code2Wav, flow: Flow, variants: Sequence[str], ramp: Sequence[int], context: int,
          out_dir: Path | None, *, multi_method: bool = False, windows: int = 3, seed: int = 0,
          stem: str = "code2wav", progress: Callable[[str], None] = lambda s: None
          ) -> tuple[list[ProgramResult], dict[str, Loaded]]:
    """Export every (variant, chunk) program of `flow`, check each stage against eager.

    Returns the results and {method: loaded program} (the run stage's, loaded from disk when
    out_dir is given). Raises FlowError when a stage cannot run; parity is judged by the caller."""
    modules = {method_name(v, c): make_variant(decoder, v, c, context) for v in variants for c in ramp}
    groups = [list(modules)] if multi_method else [[m] for m in modules]
    tol = tolerance(flow.name)
    results, loaded_by_method = [], {}
    for gi, group in enumerate(groups, 1):
        t0 = time.perf_counter()
        mods = {m: modules[m] for m in group}
        specs = {m: method_spec(mods[m], mods[m].__class__.__name__.lower(), mods[m].chunk) for m in group}
        inputs = {m: parity_inputs(mods[m], windows, seed) for m in group}
        res = {m: ProgramResult(flow.name, specs[m], None, tol, windows=windows, module=mods[m]) for m in group}
        if flow.name == "eager":
            loaded = EagerLoaded(mods)
            for m in group:
                res[m].stages["run"] = check_method(loaded.run, mods[m], m, inputs[m])
        else:
            first = {m: _first_inputs(mods[m], inputs[m][0]) for m in group}
            eps = export_stage(mods, first)
            t_export = time.perf_counter() - t0
            for m in group:
                res[m].stages["export"] = check_method(lambda _m, x, ep=eps[m]: _as_tuple(ep.module()(*x)), mods[m], m, inputs[m][:1])
            t1 = time.perf_counter()
            lowered = lower_stage(flow, eps)
            t_lower = time.perf_counter() - t1
            if flow.is_executorch:
                in_memory = load(flow, buffer=lowered)
                for m in group:
                    res[m].stages["lower"] = check_method(in_memory.run, mods[m], m, inputs[m][:1])
            if out_dir is not None:
                stem_g = stem if multi_method else f"{stem}_{group[0]}"
                paths = serialize_stage(flow, lowered, out_dir, stem_g)
                loaded = load(flow, {m: paths[m] for m in group})
            else:
                paths, loaded = {}, (in_memory if flow.is_executorch else load(flow, _tmp_paths(flow, lowered)))
            runner = Runner(flow.name, loaded, specs, decoder.config.codebook_size)
            for m in group:
                res[m].stages["run"] = check_method(runner.run, mods[m], m, inputs[m])
                res[m].path = paths.get(m)
                res[m].bytes = paths[m].stat().st_size if m in paths else (len(lowered) if flow.is_executorch else 0)
                res[m].seconds = {"export": t_export / len(group), "lower": t_lower / len(group)}
        for m in group:
            loaded_by_method[m] = loaded
            r = res[m]
            results.append(r)
            mb = r.bytes / 1e6
            status = "ok" if r.passed else "OVER TOLERANCE"
            progress(f"[{len(results)}/{len(modules)}] {flow.name} {m} (chunk {r.spec.chunk}): "
                     f"{time.perf_counter() - t0:.1f}s, {mb:.1f} MB, {r.diff.describe()} -> {status}")
    return results, loaded_by_method


def _first_inputs(module, codes: Tensor) -> tuple:
    return (codes, *module.initial_state()) if isinstance(module, Stateful) else (codes,)


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _tmp_paths(flow: Flow, lowered) -> dict[str, Path]:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="c2w-"))
    return serialize_stage(flow, lowered, d, "program")
