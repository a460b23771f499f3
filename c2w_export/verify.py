"""`c2w-export verify`: prove an artifacts directory is what its manifest says, still matches the
model, and computes what the eager decoder computes (windows, a full stream, bundled vectors).

Exit codes: 0 all pass; 1 a parity failure (program, diff, tolerance named); 2 corrupt or
missing files, a bad manifest or a usage error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .artifacts import open_artifacts
from .checkpoint import load_decoder, sha256_file
from .codes import check_windows
from .compare import Diff
from .export import stream_check
from .pipeline import check_method
from .tolerances import Tolerance
from .variants import make_variant

EXIT_OK, EXIT_PARITY, EXIT_BAD_INPUT = 0, 1, 2


@dataclass
class Row:
    check: str
    target: str
    diff: Diff | None
    tolerance: Tolerance | None
    passed: bool
    detail: str = ""

    def to_json(self) -> dict:
        return {"check": self.check, "target": self.target, "passed": self.passed, "detail": self.detail,
                "diff": self.diff.to_json() if self.diff else None,
                "tolerance": self.tolerance.to_json() if self.tolerance else None}


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    exit_code: int = EXIT_OK

    def table(self) -> str:
        lines = [f"{'check':<10} {'target':<26} {'max_abs':>10} {'SNR dB':>8} {'tol':>9}  result"]
        for r in self.rows:
            ma = f"{r.diff.max_abs:.3g}" if r.diff else "-"
            snr = ("inf" if r.diff.snr_db == float("inf") else f"{r.diff.snr_db:.1f}") if r.diff else "-"
            tol = f"{r.tolerance.max_abs:g}" if r.tolerance else "-"
            lines.append(f"{r.check:<10} {r.target:<26} {ma:>10} {snr:>8} {tol:>9}  {'PASS' if r.passed else 'FAIL'}"
                         + (f"  {r.detail}" if r.detail else ""))
        return "\n".join(lines)


def verify(artifacts_dir: str | Path, model: str | None = None, windows: int = 3, seed: int = 1234,
           progress=print) -> Report:
    """Raises ManifestError/ArtifactError/CheckpointError for exit-2 problems; returns the report."""
    report = Report()
    art = open_artifacts(artifacts_dir)
    problems = art.check_files()
    if problems:
        from .artifacts import ArtifactError

        raise ArtifactError("; ".join(problems))
    report.rows.append(Row("hashes", f"{len(art.files())} file(s)", None, None, True))
    m = art.manifest
    decoder = load_decoder(model or m["model"]["id"])
    cfg = decoder.config
    same_cfg = cfg.canonical_sha256() == m["model"]["config_sha256"]
    weights_sha = sha256_file(decoder.checkpoint.weights_path)
    same_w = weights_sha == m["model"]["weights_sha256"]
    report.rows.append(Row("model", "config + weights sha256", None, None, same_cfg and same_w,
                           "" if same_cfg and same_w else
                           f"artifacts were built from a different checkpoint (config match={same_cfg}, weights match={same_w})"))
    run = art.runner()
    progress(f"loaded {len(art.specs)} method(s) from {artifacts_dir}")
    by_method = {p["method"]: p for p in m["programs"]}
    for method, spec in art.specs.items():
        entry = by_method[method]
        tol = Tolerance(**entry["tolerance"])
        module = make_variant(decoder, spec.variant, spec.chunk, spec.context)
        codes = check_windows(cfg.num_quantizers, spec.frames, cfg.codebook_size, windows, seed)
        d = check_method(run.run, module, method, codes)
        report.rows.append(Row("windows", method, d, tol, d.within(tol), f"{windows} window(s)" if d.within(tol) else
                               f"{entry['backend']} {method} over tolerance: {d.describe()}"))
    ramp, context = m["decode"]["ramp"], m["decode"]["context_frames"]
    frames = sum(ramp) + ramp[-1] + 5
    tol = Tolerance(**m["programs"][0]["tolerance"])
    for v, d in stream_check(decoder, run.run, m["decode"]["variants"], ramp, context, frames, seed + 1).items():
        report.rows.append(Row("stream", f"{v} ({frames} frames)", d, tol, d.within(tol),
                               "" if d.within(tol) else f"{v} stream over tolerance: {d.describe()}"))
    if any("bundle" in p for p in m["programs"]):
        from .bundle import verify_bundles

        report.rows += verify_bundles(art)
    report.exit_code = EXIT_OK if all(r.passed for r in report.rows) else EXIT_PARITY
    return report


def report_json(report: Report) -> str:
    return json.dumps({"exit_code": report.exit_code, "passed": report.exit_code == 0,
                       "rows": [r.to_json() for r in report.rows]}, indent=2)
