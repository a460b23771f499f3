"""`c2w-export verify`: prove an artifacts directory is what its manifest says, still matches the
model, and computes what the eager decoder computes (windows, a full stream, bundled vectors).
The checks are ship/checks.py's, run in order; the conformance plugin runs the same ones as tests.

Exit codes: 0 all pass; 1 a parity failure (program, diff, tolerance named); 2 corrupt or
missing files, a bad manifest or a usage error (raised as exceptions; the CLI maps them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..program.streaming import stream_frames
from ..program.variants import parity_inputs
from .checks import (Row, Subject, arithmetic_rows, contract_row, method_rows, model_row, record_rows,
                     stream_rows, tolerance_rows, window_rows)

__all__ = ["EXIT_OK", "EXIT_PARITY", "Report", "Row", "verify"]

EXIT_OK, EXIT_PARITY = 0, 1


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
    """Raises ManifestError/ArtifactError/CheckpointError/FlowError for exit-2 problems; returns the report."""
    report = Report()
    s = Subject(artifacts_dir, model)
    s.art.require_files()
    report.rows.append(Row("hashes", f"{len(s.art.files())} file(s)", None, None, True))
    report.rows.append(model_row(s))
    contract = contract_row(s)  # the published contract against the checkpoint's own
    report.rows += [contract, *record_rows(s)]
    if not contract.passed:  # the programs would be run against a contract that is not theirs: nothing after it means anything
        report.exit_code = EXIT_PARITY
        return report
    s.dispatch()  # every file opened (the bundled vectors first, in a child), its metadata checked
    progress(f"loaded {len(s.art.specs)} method(s) from {artifacts_dir}")
    for rel in s.art.files():
        report.rows += method_rows(s, rel)
    report.rows += arithmetic_rows(s)
    for method in s.art.specs:
        report.rows += tolerance_rows(s, method)
        report.rows += window_rows(s, method, parity_inputs(s.module(method), windows, seed), f"{windows} window(s)")
    d = s.manifest["decode"]
    frames = stream_frames(d["ramp"], 5, d["context_frames"] if "windowed" in d["variants"] else 0)
    report.rows += stream_rows(s, frames, seed + 1)
    report.rows += s.bundles
    report.exit_code = EXIT_OK if all(r.passed for r in report.rows) else EXIT_PARITY
    return report
