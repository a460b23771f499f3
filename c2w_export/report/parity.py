"""Markdown reports written by complete parity runs: reports/parity.md (the CI summary) and
reports/numerics.md (every flow, variant and chunk, with versions and the CPU), plus the numerics
baseline (reports/numerics-baseline.json) that later runs are compared with.

A row: {flow, variant, chunk, reference, max_abs, snr_db[, stages]}, the worst over the windows or
stream steps a test checked. Drift against the baseline is the ratio of max abs diffs; a row whose
max abs grew more than BASELINE_GROWTH x (above the BASELINE_FLOOR noise floor) is a regression.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from pathlib import Path
from typing import Iterable

from ..env import cpu_name, versions
from ..fileio import atomic_write_bytes, read_json

BASELINE_FILE = "numerics-baseline.json"
BASELINE_GROWTH = 10.0  # max abs may grow this much against the baseline before the run fails
# Rows at or below this max abs count as this much: fp32 rows that are exactly 0 (torch_export vs
# eager) or ~1e-7 would otherwise "grow 10x" on a reordering that is still far below every gate.
BASELINE_FLOOR = 1e-6


def _snr(x) -> str:
    if x is None:
        return "inf"
    return f"{x:.1f}" if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def _header(title: str) -> list[str]:
    v = versions()
    return [f"# {title}", "",
            f"Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC} on {cpu_name()} "
            f"({platform.machine()}), torch {v['torch']}, executorch {v['executorch']}, "
            f"c2w_export {v['c2w_export']}, Python {v['python']}.", ""]


def row_key(r: dict) -> str:
    return f"{r['flow']}|{r['variant']}|{r.get('chunk') if r.get('chunk') is not None else '-'}"


def _json_num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def save_baseline(rows: Iterable[dict], path: Path) -> None:
    """Worst max abs and SNR per (flow, variant, chunk), with versions and CPU."""
    data = {"versions": versions(), "cpu": cpu_name(),
            "rows": {row_key(r): {"max_abs": _json_num(r["max_abs"]), "snr_db": _json_num(r["snr_db"])}
                     for r in sorted(rows, key=row_key)}}
    atomic_write_bytes(Path(path), (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def load_baseline(path: Path) -> dict | None:
    path = Path(path)
    return read_json(path, ValueError) if path.is_file() else None


def drift(rows: Iterable[dict], baseline: dict | None) -> dict[str, float]:
    """row key -> max abs now / max abs in the baseline (both floored at BASELINE_FLOOR); rows the
    baseline does not hold are left out. A non-finite max abs now is an infinite ratio."""
    out = {}
    for r in rows:
        base = (baseline or {}).get("rows", {}).get(row_key(r))
        if base is None:
            continue
        now = r["max_abs"]
        then = base["max_abs"] if base["max_abs"] is not None else math.inf
        out[row_key(r)] = math.inf if not math.isfinite(now) else max(now, BASELINE_FLOOR) / max(then, BASELINE_FLOOR)
    return out


def regressions(rows: Iterable[dict], baseline: dict | None) -> list[str]:
    """Rows whose max abs grew more than BASELINE_GROWTH x against the baseline, described."""
    return [f"{k}: max abs grew {ratio:.1f}x against the baseline (limit {BASELINE_GROWTH:g}x)"
            for k, ratio in sorted(drift(rows, baseline).items()) if ratio > BASELINE_GROWTH]


def time_section(t: dict) -> list[str]:
    """'Where the time went' of a complete run: `t` from the suite's time budget (tests/conftest.py):
    wall_s, workers, test_s, files {file: s}, slowest [(test, s)], lowered, distinct, lowering_s, hits,
    discarded, by_test {test: (methods lowered there, s)} (optional)."""
    wall = f"{t['wall_s'] / 60:.1f} min wall" if t.get("wall_s") else "wall time unknown"
    repeated = t["lowered"] - t["distinct"]
    lines = ["", "## Where the time went", "",
             f"{wall} with {t['workers'] or 1} worker(s); {t['test_s'] / 60:.1f} worker-minutes of tests "
             "(setup, call and teardown).", "",
             f"Lowerings: {t['lowered']} method program(s) lowered ({t['distinct']} distinct"
             f"{f', {repeated} lowered again' if repeated else ''}) in {t['lowering_s']:.0f} s; "
             f"{t['hits']} read back from the lowering cache; {t['discarded']} corrupt cache entr(ies) discarded.", "",
             "| test file | s |", "|---|---|"]
    lines += [f"| {f} | {s:.1f} |" for f, s in sorted(t["files"].items(), key=lambda kv: -kv[1])]
    lines += ["", "The ten slowest tests:", "", "| test | s |", "|---|---|"]
    lines += [f"| `{n}` | {s:.1f} |" for n, s in t["slowest"]]
    if t.get("by_test"):  # who paid for each lowering: the first test to need a program lowers it
        lines += ["", "The tests that lowered (the first to need a program lowers it; the others read it back):", "",
                  "| test | methods lowered (partitioner) | s |", "|---|---|---|"]
        lines += [f"| `{n}` | {', '.join(m)} | {s:.1f} |" for n, (m, s) in sorted(t["by_test"].items(), key=lambda kv: -kv[1][1])]
    return lines


def write_parity_reports(rows: list[dict], out: Path, suffix: str = "", config: str = "tiny",
                         baseline: dict | None = None, timing: dict | None = None) -> None:
    """numerics{suffix}.md and parity{suffix}.md from the rows of a complete run; `timing`, when
    given, adds where the run's time went to parity{suffix}.md (time_section)."""
    out.mkdir(parents=True, exist_ok=True)
    ratios = drift(rows, baseline)
    base_note = (f"Drift: max abs now / in the committed baseline ({BASELINE_FILE}: "
                 f"{baseline['cpu']}, torch {baseline['versions']['torch']}, executorch "
                 f"{baseline['versions']['executorch']}); a row over {BASELINE_GROWTH:g}x fails the run."
                 if baseline else "No baseline to compare with.")
    lines = _header(f"Numerics per flow and chunk ({config} config)")
    lines += ["Max abs diff and SNR of each program against its reference on the same inputs (worst over the "
              "checked windows or stream steps): artifact flows against the fp32 eager decoder, the eager flow "
              "against the fp64 decode, streams against the offline decode. Stateful rows feed each program's "
              "own state back.", "", base_note, "",
              "| flow | variant | chunk | reference | max abs diff | SNR dB | drift | per stage max abs |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["flow"], r["variant"], r.get("chunk") or 0)):
        stages = ", ".join(f"{k} {v:.2g}" for k, v in (r.get("stages") or {}).items())
        ratio = ratios.get(row_key(r))
        lines.append(f"| {r['flow']} | {r['variant']} | {r.get('chunk') or '-'} | {r.get('reference', '-')} | "
                     f"{r['max_abs']:.3g} | {_snr(r['snr_db'])} | {'-' if ratio is None else f'{ratio:.2f}x'} | {stages} |")
    (out / f"numerics{suffix}.md").write_text("\n".join(lines) + "\n")
    worst: dict[tuple[str, str], dict] = {}
    for r in rows:
        k = (r["flow"], r["variant"])
        if k not in worst or r["max_abs"] > worst[k]["max_abs"]:
            worst[k] = r
    flow_drift: dict[str, float] = {}
    for r in rows:
        if row_key(r) in ratios:
            flow_drift[r["flow"]] = max(flow_drift.get(r["flow"], 0.0), ratios[row_key(r)])
    lines = _header(f"Parity summary ({config} config)")
    lines += ["Worst max abs diff and SNR per flow and variant against its reference; see numerics.md for every "
              "chunk. Drift is the worst ratio of this run's max abs to the baseline's over the flow's rows.", "",
              "| flow | variant | reference | worst max abs | SNR dB | at chunk | flow drift |", "|---|---|---|---|---|---|---|"]
    for (f, v), r in sorted(worst.items()):
        fd = flow_drift.get(f)
        lines.append(f"| {f} | {v} | {r.get('reference', '-')} | {r['max_abs']:.3g} | {_snr(r['snr_db'])} | "
                     f"{r.get('chunk') or '-'} | {'-' if fd is None else f'{fd:.2f}x'} |")
    if timing:
        lines += time_section(timing)
    (out / f"parity{suffix}.md").write_text("\n".join(lines) + "\n")
