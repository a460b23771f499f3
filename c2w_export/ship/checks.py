"""The checks of a shipped artifacts directory, one implementation for `c2w-export verify` (which
runs them in order, ship/verify.py) and the conformance plugin (which runs each as its own pytest
test, conformance/): each returns `Row`s that carry the verdict and a one-line reason.

A `Subject` is the artifacts directory under check and what its checks share (the decoder, the
own references, each program file opened), each made on first use and kept: a problem found
while making it is remembered, so every check that needs it reports the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

from torch import Tensor

from ..env import cpu_name, describe_arithmetic
from ..fileio import sha256_file
from ..model.checkpoint import CheckpointError, load_decoder
from ..model.decoder import Code2Wav
from ..program import flows
from ..program.compare import Diff
from ..program.flows import Loaded, ModuleLoaded, get_flow
from ..program.native_fp16 import emulated
from ..program.pipeline import NATIVE, QUALITY, check_method
from ..program.precision import Precision, get_precision, own_references, with_precision
from ..program.runner import Dispatch, Runner
from ..program.streaming import StreamCheck, stream_check
from ..program.tolerances import Tolerance, bundle_state_rtol, tolerance
from ..program.variants import Stateful, Windowed, make_variant
from . import manifest as mf
from .artifacts import Artifacts, open_artifacts
from .contract import checkpoint_problems, program_problems
from .probe import in_child


@dataclass
class Row:
    check: str
    target: str
    diff: Diff | None
    tolerance: Tolerance | None
    passed: bool
    detail: str = ""
    warning: bool = False  # passed, but something worth reading (a record-only field absent)

    def to_json(self) -> dict:
        return {"check": self.check, "target": self.target, "passed": self.passed, "warning": self.warning,
                "detail": self.detail,
                "diff": self.diff.to_json() if self.diff else None,
                "tolerance": self.tolerance.to_json() if self.tolerance else None}


class NotChecked(RuntimeError):
    """What a check needs failed elsewhere (a file's hash, its runtime, the contract): the reason."""


class Subject:
    """An artifacts directory (`open_artifacts`: ManifestError when its manifest is unreadable or
    contradicts itself) and the model it is checked against (`model`, else the manifest's model.id)."""

    def __init__(self, root: str | Path, model: str | None = None, runtime: Callable[[Loaded], Loaded] | None = None,
                 cpu: str | None = None, arithmetic: str | None = None):
        self.art: Artifacts = open_artifacts(root)
        self.model = model
        # another runtime for the programs (the conformance plugin's --c2w-arch aarch64: arm64.session.on_arm),
        # the CPU it computes on and that CPU's fp16 arithmetic (env.FP16_ARITHMETICS); default: this process's
        self.runtime, self.cpu, self.arithmetic = runtime, cpu or cpu_name(), arithmetic
        self._files: dict[str, list[str]] = {}
        self._opened: dict[str, dict[str, Runner] | Exception] = {}

    @property
    def manifest(self) -> dict:
        return self.art.manifest

    @cached_property
    def decoder(self) -> Code2Wav:
        """The checkpoint's fp32 decoder; CheckpointError (naming $.model.id when it came from there)."""
        try:
            return load_decoder(self.model or self.manifest["model"]["id"])
        except CheckpointError as e:
            if self.model:
                raise
            raise CheckpointError(f"{self.art.root / mf.MANIFEST}: $.model.id: {e}") from None

    @cached_property
    def precision(self) -> Precision:
        """The programs' precision; FlowError naming a backend that has no gate at it."""
        p = get_precision(mf.precision_of(self.manifest))
        for backend in sorted({e["backend"] for e in self.manifest["programs"]}):
            with_precision(get_flow(backend), p.name)
        return p

    @property
    def reduced(self) -> bool:
        return self.precision.stage is not None

    @cached_property
    def own(self) -> dict:
        """{method: the eager module a reduced-precision program is compared with (gate side 1)},
        rebuilt from the checkpoint as an export builds it, never read from disk; {} at fp32."""
        return own_references(self.decoder, self.precision.name, self.art.specs) if self.reduced else {}

    def module(self, method: str) -> Windowed | Stateful:
        """The fp32 eager module of `method`, from the checkpoint."""
        spec = self.art.specs[method]
        return make_variant(self.decoder, spec.variant, spec.max_chunk, spec.context)

    @cached_property
    def bundles(self) -> list[Row]:
        """verify_bundles of the bundle files that match the manifest, once (first: before this
        process runs a method; see verify_bundles)."""
        return verify_bundles(self.art, {rel for rel in self.art.named_files() if not self.file_problems(rel)})

    def file_problems(self, rel: str) -> list[str]:
        """Artifacts.file_problems, once per file."""
        if rel not in self._files:
            self._files[rel] = self.art.file_problems(rel)
        return self._files[rel]

    def runners(self, rel: str) -> dict[str, Runner]:
        """{method: Runner} of program file `rel`, opened once: its hash checked (NotChecked), the
        bundled vectors run first (in a child, while no method ran here), then Artifacts.open_file
        (ArtifactError, FlowError). A failure is kept and raised again for every later check."""
        if rel not in self._opened:
            try:
                self._opened[rel] = self._open(rel)
            except Exception as e:  # noqa: BLE001 -- kept as it is: verify maps it to an exit code
                self._opened[rel] = e
        opened = self._opened[rel]
        if isinstance(opened, Exception):
            raise opened
        return opened

    def _open(self, rel: str) -> dict[str, Runner]:
        if self.file_problems(rel):
            raise NotChecked(f"not run: {'; '.join(self.file_problems(rel))}")
        self.bundles  # noqa: B018 -- first, while no method ran here: the vectors then run in a child
        runners = self.art.open_file(rel)
        if self.runtime is not None:
            for runner in {id(r): r for r in runners.values()}.values():
                runner.loaded = self.runtime(runner.loaded)
        return runners

    def program_problems(self, method: str) -> list[str]:
        """The published inputs and outputs of `method` against its program's own metadata."""
        runner = self.runners(self.art.file_of(method))[method]
        return program_problems(self.manifest, {method: self.art.specs[method]}, {method: runner.loaded})

    def run(self, method: str, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """A RunFn over every program file (each opened on first use)."""
        return self.runners(self.art.file_of(method))[method].run(method, inputs)

    def dispatch(self) -> Dispatch:
        """Every program file opened (runners), behind one checked Dispatch (Artifacts.dispatch)."""
        return self.art.dispatch({m: r for rel in self.art.files() for m, r in self.runners(rel).items()})


# ---------------------------------------------------------------- the checks, as rows
def model_row(s: Subject) -> Row:
    """The checkpoint is the one the artifacts were built from (config and weights sha256)."""
    cfg, m = s.decoder.config, s.manifest
    same_cfg = cfg.canonical_sha256() == m["model"]["config_sha256"]
    same_w = sha256_file(s.decoder.checkpoint.weights_path) == m["model"]["weights_sha256"]
    return Row("model", "config + weights sha256", None, None, same_cfg and same_w,
               "" if same_cfg and same_w else
               f"artifacts were built from a different checkpoint (config match={same_cfg}, weights match={same_w})")


def contract_problems(s: Subject, method: str | None = None) -> list[str]:
    """The published contract against the checkpoint's own (contract.checkpoint_problems); with
    `method`, only the problems that concern it: its program entry, the decode fields, and the state
    when it is stateful."""
    problems = checkpoint_problems(s.manifest, s.decoder)
    if method is None:
        return problems
    index = s.manifest["programs"].index(s.art.entry(method))
    stateful = s.art.specs[method].variant == "stateful"

    def concerns(problem: str) -> bool:
        if problem.startswith("$.programs["):
            return problem.startswith((f"$.programs[{index}].", f"$.programs[{index}] "))
        return stateful or not problem.startswith("$.state")
    return [p for p in problems if concerns(p)]


def contract_row(s: Subject) -> Row:
    problems = contract_problems(s)
    return Row("contract", "manifest vs checkpoint", None, None, not problems,
               "methods, I/O names, shapes, dtypes, state and order, hop and sample rate match"
               if not problems else "; ".join(problems))


def record_rows(s: Subject) -> list[Row]:
    """A warning per record-only field absent (nothing reads it)."""
    return [Row("record", path, None, None, True, "absent (a record only: nothing reads it)", warning=True)
            for path in mf.missing_records(s.manifest)]


def method_rows(s: Subject, rel: str) -> list[Row]:
    """File `rel` holds exactly the methods the manifest names for it (a missing one already failed
    to load); an extra method is reported by name."""
    named = sorted(p["method"] for p in s.manifest["programs"] if p["path"] == rel)
    held = sorted(s.runners(rel)[named[0]].loaded.methods)
    extra = sorted(set(held) - set(named))
    return [Row("methods", rel, None, None, not extra,
                f"{len(held)} method(s) by name" if not extra else f"{rel} holds method(s) {extra} the manifest does not name")]


def arithmetic_rows(s: Subject) -> list[Row]:
    """A reduced precision's side 1 is gated for this CPU's arithmetic: the row names it."""
    if not s.reduced:
        return []
    arithmetic = s.arithmetic if s.arithmetic and s.precision.half else s.precision.arithmetic()
    return [Row("arithmetic", s.precision.name, None, None, True, f"{s.cpu}: {describe_arithmetic(arithmetic)}")]


def tolerance_rows(s: Subject, method: str) -> list[Row]:
    """A manifest that records a looser tolerance than the installed table fails (checks use the table)."""
    entry = s.art.entry(method)
    tol = tolerance(entry["backend"], s.precision.key, s.arithmetic)
    t = entry["tolerance"]  # the schema requires max_abs and min_snr_db; why is a record
    recorded = Tolerance(t["max_abs"], t["min_snr_db"], t.get("why", ""))
    if recorded.max_abs > tol.max_abs or recorded.min_snr_db < tol.min_snr_db:
        return [Row("tolerance", method, None, tol, False,
                    f"manifest records a looser tolerance (max_abs<={recorded.max_abs:g}, SNR>="
                    f"{recorded.min_snr_db:g} dB) than this c2w-export's table; checked at the table's")]
    return []


def window_rows(s: Subject, method: str, calls: Sequence[tuple[Tensor, ...]], what: str) -> list[Row]:
    """`calls` (parity_inputs-shaped) through the program of `method`, against:
    - fp32: the eager decoder, at the flow's tolerance ("windows");
    - a reduced precision: its own eager reference at the flow's gate (side 1, "windows"), fp32
      eager at the quality floor (side 2, "quality"), and for a half precision the own reference
      with native fp16 arithmetic, emulated, at the quality floor (what a phone gets, on every CPU)."""
    backend = s.art.entry(method)["backend"]
    tol = tolerance(backend, s.precision.key, s.arithmetic)  # the installed table, never the manifest's record
    module, rows = s.module(method), []
    name = s.precision.name
    if s.reduced:
        d = check_method(s.run, s.own[method], method, calls)
        rows.append(Row("windows", method, d, tol, d.within(tol), f"{what} vs own {name}" if d.within(tol) else
                        f"{backend} {method} over tolerance of its own {name} reference: {d.describe()}"))
        tol, check = tolerance(QUALITY, s.precision.key, s.arithmetic), "quality"
    else:
        check = "windows"
    d = check_method(s.run, module, method, calls)
    rows.append(Row(check, method, d, tol, d.within(tol), what if d.within(tol) else
                    f"{backend} {method} over tolerance: {d.describe()}"))
    if s.precision.half:
        d = check_method(emulated(s.own[method]), module, method, calls)
        rows.append(Row(NATIVE, method, d, tol, d.within(tol),
                        f"{what}, own reference with native fp16 arithmetic (emulated)" if d.within(tol) else
                        f"{method} with native fp16 arithmetic (emulated, as phones compute) over the quality "
                        f"floor: {d.describe()}"))
    return rows


def upstream_rows(s: Subject, oracle, method: str, calls: Sequence[tuple[Tensor, ...]], what: str) -> list[Row]:
    """`calls` through the program of `method` against upstream's decode of the same codes
    (`oracle`: conformance.upstream.Oracle on this checkpoint), at the flow's tolerance (fp32) or the
    quality floor (a reduced precision)."""
    backend = s.art.entry(method)["backend"]
    tol = tolerance(QUALITY, s.precision.key, s.arithmetic) if s.reduced else tolerance(backend, s.precision.key, s.arithmetic)
    spec = s.art.specs[method]
    state = s.art.initial_state() if spec.variant == "stateful" else ()  # the program's, not the oracle's
    d = check_method(s.run, oracle.variant(spec.variant, spec.context), method, calls, state)
    return [Row("upstream", method, d, tol, d.within(tol), what if d.within(tol) else
                f"{backend} {method} over tolerance against upstream qwen-tts: {d.describe()}")]


def stream_rows(s: Subject, frames: int, seed: int, calls: Sequence[int] | None = None,
                variants: Sequence[str] | None = None) -> list[Row]:
    """A whole stream of `frames` random frames through each of `variants` (default: the manifest's;
    program/streaming.stream_check): in the manifest's ramp, or in `calls` (chunk sizes in any
    order, summing to `frames`) when given."""
    d = s.manifest["decode"]
    gate = tolerance(s.manifest["programs"][0]["backend"], s.precision.key, s.arithmetic)
    quality = tolerance(QUALITY, s.precision.key, s.arithmetic) if s.reduced else None
    # reduced precision: side 2 at the quality floor, side 1 against the own reference's stream
    checks: list[StreamCheck] = stream_check(
        s.decoder, s.run, variants or d["variants"], d["ramp"], d["context_frames"], frames, seed, quality or gate,
        ModuleLoaded(s.own).run if s.reduced else None, gate, f"its own {s.precision.name} eager", calls=calls)
    return [Row("stream", f"{c.name} ({frames} frames)", c.diff, c.tolerance, c.passed,
                "" if c.passed else f"over tolerance: {c.describe()}") for c in checks]


def verify_bundles(art: Artifacts, good: set[str] | None = None) -> list[Row]:
    """Each bundled vector (of the bundle files in `good`, default all) run through the runtime's bundled-program API, in a child process while
    this process has run no ExecuTorch method (a damaged .bpte behind a re-hashed manifest crashes
    the runtime, and not always at the same place: tests/test_fuzz.py), else here. A child that
    dies fails every bundled method of the run, naming the signal."""
    bundled = [p for p in art.manifest["programs"] if p.get("bundle") and (good is None or p["bundle"]["path"] in good)]
    if not bundled:
        return []
    paths = sorted({p["bundle"]["path"] for p in bundled})
    if flows.EXECUTORCH_RAN:
        results, why = bundle_results(art, paths), None
    else:
        results, why = in_child(bundle_results, art, paths)
    if why:
        return [Row("bundle", p["method"], None, None, False, f"{p['bundle']['path']}: {why} when its vectors ran in "
                                                             f"a child process") for p in bundled]
    return [Row("bundle", method, None, None, passed, detail) for method, passed, detail in results]


def bundle_results(art: Artifacts, paths: Sequence[str] | None = None) -> list[tuple[str, bool, str]]:
    """(method, passed, detail) per bundled method: BundledModule.verify_result_with_bundled_expected_output
    executes the method on the bundled inputs and compares with the bundled expected outputs inside
    the runtime."""
    from executorch.extension.pybindings import portable_lib

    rows, loaded = [], {}
    key = get_precision(mf.precision_of(art.manifest)).key
    for p in art.manifest["programs"]:
        b = p.get("bundle")
        if not b or (paths is not None and b["path"] not in paths):
            continue
        atol = tolerance(p["backend"], key).max_abs
        rtol = bundle_state_rtol(key) if p["variant"] == "stateful" else 0.0
        if rtol is None:
            rows.append((p["method"], False, f"no measured state tolerance for bundles of {key} programs"))
            continue
        try:
            if b["path"] not in loaded:
                flows.EXECUTORCH_RAN = True
                loaded[b["path"]] = portable_lib._load_bundled_program_from_buffer((art.root / b["path"]).read_bytes())
            for i in range(b["cases"]):
                loaded[b["path"]].verify_result_with_bundled_expected_output(p["method"], i, rtol, atol)
            rows.append((p["method"], True, f"{b['cases']} vector(s) via bundled API (atol {atol:g}, rtol {rtol:g})"))
        except Exception as e:
            rows.append((p["method"], False, f"bundled vectors failed (atol {atol:g}, rtol {rtol:g}): "
                                             f"{type(e).__name__}: {e}"))
    return rows
