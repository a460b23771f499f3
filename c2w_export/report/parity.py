"""Markdown reports written by the parity run: reports/parity.md (the CI summary) and
reports/numerics.md (every flow, variant and chunk, with versions)."""

from __future__ import annotations

import datetime as _dt
import math
import platform
from pathlib import Path

from ..env import cpu_name, versions


def _snr(x) -> str:
    return "inf" if x is None or (isinstance(x, float) and math.isinf(x)) else f"{x:.1f}"


def _header(title: str) -> list[str]:
    v = versions()
    return [f"# {title}", "",
            f"Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC} on {cpu_name()} "
            f"({platform.machine()}), torch {v['torch']}, executorch {v['executorch']}, "
            f"c2w_export {v['c2w_export']}, Python {v['python']}.", ""]


def write_parity_reports(rows: list[dict], out: Path, config: str | None = None) -> None:
    """rows: {flow, variant, chunk, max_abs, snr_db[, stages]} from the parity tests. A run of only
    real-size rows (flow "... (real)", tox -e real) writes numerics-real.md / parity-real.md."""
    out.mkdir(parents=True, exist_ok=True)
    real_only = all(r["flow"].endswith("(real)") for r in rows)
    config = config or ("real" if real_only else "tiny")
    suffix = "-real" if real_only else ""
    lines = _header(f"Numerics per flow and chunk ({config} config)")
    lines += ["Max abs diff and SNR against the eager decoder on the same inputs (worst over the checked windows "
              "or stream steps). Stateful rows feed each program's own state back.", "",
              "| flow | variant | chunk | max abs diff | SNR dB | per stage max abs |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["flow"], r["variant"], r.get("chunk") or 0)):
        stages = ", ".join(f"{k} {v:.2g}" for k, v in (r.get("stages") or {}).items())
        lines.append(f"| {r['flow']} | {r['variant']} | {r.get('chunk', '-')} | {r['max_abs']:.3g} | {_snr(r['snr_db'])} | {stages} |")
    (out / f"numerics{suffix}.md").write_text("\n".join(lines) + "\n")
    worst: dict[tuple[str, str], dict] = {}
    for r in rows:
        k = (r["flow"], r["variant"])
        if k not in worst or r["max_abs"] > worst[k]["max_abs"]:
            worst[k] = r
    lines = _header(f"Parity summary ({config} config)")
    lines += ["Worst max abs diff and SNR per flow against eager; see numerics.md for every chunk.", "",
              "| flow | variant | worst max abs | SNR dB | at chunk |", "|---|---|---|---|---|"]
    for (f, v), r in sorted(worst.items()):
        lines.append(f"| {f} | {v} | {r['max_abs']:.3g} | {_snr(r['snr_db'])} | {r.get('chunk', '-')} |")
    (out / f"parity{suffix}.md").write_text("\n".join(lines) + "\n")
