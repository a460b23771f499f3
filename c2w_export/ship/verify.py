"""`c2w-export verify`: prove an artifacts directory is what its manifest says, still matches the
model, and computes what the eager decoder computes (windows, a full stream, bundled vectors).

Exit codes: 0 all pass; 1 a parity failure (program, diff, tolerance named); 2 corrupt or
missing files, a bad manifest or a usage error (raised as exceptions; the CLI maps them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..fileio import sha256_file
from ..model.checkpoint import CheckpointError, load_decoder
from ..program.compare import Diff
from ..program import flows
from ..program.flows import ModuleLoaded, get_flow
from ..env import cpu_name, describe_arithmetic
from ..program.native_fp16 import emulated
from ..program.pipeline import NATIVE, QUALITY, check_method, parity_inputs
from ..program.precision import get_precision, own_references, with_precision
from ..program.streaming import stream_check, stream_frames
from ..program.runner import Dispatch
from ..program.tolerances import Tolerance, bundle_state_rtol, tolerance
from ..program.variants import make_variant
from . import manifest as mf
from .artifacts import Artifacts, open_artifacts
from .contract import checkpoint_problems
from .probe import in_child

EXIT_OK, EXIT_PARITY = 0, 1


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


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    exit_code: int = EXIT_OK

    def table(self) -> str:
        w = max([10, *(len(r.check) for r in self.rows)])
        lines = [f"{'check':<{w}} {'target':<26} {'max_abs':>10} {'SNR dB':>8} {'tol':>9}  result"]
        for r in self.rows:
            ma = f"{r.diff.max_abs:.3g}" if r.diff else "-"
            snr = ("inf" if r.diff.snr_db == float("inf") else f"{r.diff.snr_db:.1f}") if r.diff else "-"
            tol = f"{r.tolerance.max_abs:g}" if r.tolerance else "-"
            verdict = ("WARN" if r.warning else "PASS") if r.passed else "FAIL"
            lines.append(f"{r.check:<{w}} {r.target:<26} {ma:>10} {snr:>8} {tol:>9}  {verdict}"
                         + (f"  {r.detail}" if r.detail else ""))
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"exit_code": self.exit_code, "passed": self.exit_code == EXIT_OK,
                           "rows": [r.to_json() for r in self.rows]}, indent=2)


def verify(artifacts_dir: str | Path, model: str | None = None, windows: int = 3, seed: int = 1234,
           progress=print) -> Report:
    """Raises ManifestError/ArtifactError/CheckpointError for exit-2 problems; returns the report."""
    report = Report()
    art = open_artifacts(artifacts_dir)
    art.require_files()
    report.rows.append(Row("hashes", f"{len(art.files())} file(s)", None, None, True))
    m = art.manifest
    try:
        decoder = load_decoder(model or m["model"]["id"])
    except CheckpointError as e:
        if model:
            raise
        raise CheckpointError(f"{art.root / mf.MANIFEST}: $.model.id: {e}") from None
    cfg = decoder.config
    same_cfg = cfg.canonical_sha256() == m["model"]["config_sha256"]
    same_w = sha256_file(decoder.checkpoint.weights_path) == m["model"]["weights_sha256"]
    report.rows.append(Row("model", "config + weights sha256", None, None, same_cfg and same_w,
                           "" if same_cfg and same_w else
                           f"artifacts were built from a different checkpoint (config match={same_cfg}, weights match={same_w})"))
    problems = checkpoint_problems(m, decoder)  # the published contract against the checkpoint's own
    report.rows.append(Row("contract", "manifest vs checkpoint", None, None, not problems,
                           "methods, I/O names, shapes, dtypes, state and order, hop and sample rate match"
                           if not problems else "; ".join(problems)))
    report.rows += [Row("record", path, None, None, True, "absent (a record only: nothing reads it)", warning=True)
                    for path in mf.missing_records(m)]
    if problems:  # the programs would be run against a contract that is not theirs: nothing after it means anything
        report.exit_code = EXIT_PARITY
        return report
    bundles = verify_bundles(art)  # before this process runs a method: then they run in a child (ship/probe.py)
    programs = art.programs()
    progress(f"loaded {len(art.specs)} method(s) from {artifacts_dir}")
    report.rows += check_method_names(art, programs)
    by_method = {p["method"]: p for p in m["programs"]}
    precision = get_precision(mf.precision_of(m))
    for backend in sorted({p["backend"] for p in m["programs"]}):
        with_precision(get_flow(backend), precision.name)  # a FlowError naming it when this pair has no gate
    reduced = precision.stage is not None
    quality = tolerance(QUALITY, precision.key) if reduced else None
    if reduced:  # side 1 of a half precision is gated for this CPU's arithmetic: name it
        report.rows.append(Row("arithmetic", precision.name, None, None, True,
                               f"{cpu_name()}: {describe_arithmetic(precision.arithmetic())}"))
    own = own_references(decoder, precision.name, art.specs) if reduced else {}  # rebuilt, never read from disk
    for method, spec in art.specs.items():
        entry = by_method[method]
        tol = tolerance(entry["backend"], precision.key)  # the installed table, never the manifest's record
        recorded = Tolerance(**entry["tolerance"])
        if recorded.max_abs > tol.max_abs or recorded.min_snr_db < tol.min_snr_db:
            report.rows.append(Row("tolerance", method, None, tol, False,
                                   f"manifest records a looser tolerance (max_abs<={recorded.max_abs:g}, SNR>="
                                   f"{recorded.min_snr_db:g} dB) than this c2w-export's table; checked at the table's"))
        module = make_variant(decoder, spec.variant, spec.max_chunk, spec.context)
        calls = parity_inputs(module, windows, seed)
        if reduced:  # side 1: against its own reference; side 2 (quality): against fp32 eager
            d = check_method(programs.run, own[method], method, calls)
            report.rows.append(Row("windows", method, d, tol, d.within(tol), f"{windows} window(s) vs own {precision.name}"
                                   if d.within(tol) else f"{entry['backend']} {method} over tolerance of its own "
                                   f"{precision.name} reference: {d.describe()}"))
            tol, name = quality, "quality"
        else:
            name = "windows"
        d = check_method(programs.run, module, method, calls)
        report.rows.append(Row(name, method, d, tol, d.within(tol), f"{windows} window(s)" if d.within(tol) else
                               f"{entry['backend']} {method} over tolerance: {d.describe()}"))
        if precision.half:  # the quality a phone gets, on every CPU: the own reference with native fp16 arithmetic
            d = check_method(emulated(own[method]), module, method, calls)
            report.rows.append(Row(NATIVE, method, d, quality, d.within(quality),
                                   f"{windows} window(s), own reference with native fp16 arithmetic (emulated)"
                                   if d.within(quality) else f"{method} with native fp16 arithmetic (emulated, as "
                                   f"phones compute) over the quality floor: {d.describe()}"))
    ramp, context, variants = m["decode"]["ramp"], m["decode"]["context_frames"], m["decode"]["variants"]
    frames = stream_frames(ramp, 5, context if "windowed" in variants else 0)
    gate = tolerance(m["programs"][0]["backend"], precision.key)
    # reduced precision: side 2 at the quality floor, side 1 against the own reference's stream
    streams = stream_check(decoder, programs.run, variants, ramp, context, frames, seed + 1, quality or gate,
                           ModuleLoaded(own).run if reduced else None, gate, f"its own {precision.name} eager")
    for s in streams:
        report.rows.append(Row("stream", f"{s.name} ({frames} frames)", s.diff, s.tolerance, s.passed,
                               "" if s.passed else f"over tolerance: {s.describe()}"))
    report.rows += bundles
    report.exit_code = EXIT_OK if all(r.passed for r in report.rows) else EXIT_PARITY
    return report


def check_method_names(art: Artifacts, programs: Dispatch) -> list[Row]:
    """Every file holds exactly the methods the manifest names for it (a missing one already
    failed to load); an extra method is reported by name."""
    rows = []
    for rel, entry in art.files().items():
        named = sorted(p["method"] for p in art.manifest["programs"] if p["path"] == rel)
        held = sorted(programs.runners[named[0]].loaded.methods)
        extra = sorted(set(held) - set(named))
        rows.append(Row("methods", rel, None, None, not extra,
                        f"{len(held)} method(s) by name" if not extra else f"{rel} holds method(s) {extra} the manifest does not name"))
    return rows


def verify_bundles(art: Artifacts) -> list[Row]:
    """Each bundled vector run through the runtime's bundled-program API, in a child process while
    this process has run no ExecuTorch method (a damaged .bpte behind a re-hashed manifest crashes
    the runtime, and not always at the same place: tests/test_fuzz.py), else here. A child that
    dies fails every bundled method of the run, naming the signal."""
    bundled = [p for p in art.manifest["programs"] if p.get("bundle")]
    if not bundled:
        return []
    if flows.EXECUTORCH_RAN:
        results, why = bundle_results(art), None
    else:
        results, why = in_child(bundle_results, art)
    if why:
        return [Row("bundle", p["method"], None, None, False, f"{p['bundle']['path']}: {why} when its vectors ran in "
                                                             f"a child process") for p in bundled]
    return [Row("bundle", method, None, None, passed, detail) for method, passed, detail in results]


def bundle_results(art: Artifacts) -> list[tuple[str, bool, str]]:
    """(method, passed, detail) per bundled method: BundledModule.verify_result_with_bundled_expected_output
    executes the method on the bundled inputs and compares with the bundled expected outputs inside
    the runtime."""
    from executorch.extension.pybindings import portable_lib

    rows, loaded = [], {}
    key = get_precision(mf.precision_of(art.manifest)).key
    for p in art.manifest["programs"]:
        b = p.get("bundle")
        if not b:
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
