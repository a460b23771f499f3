"""Write reports/mutation.md from a finished `mutmut run` (tox -e mutation).

Reads mutmut's results under mutants/ and the reviewed verdicts in tests/mutation_verdicts.toml
(mutant name, or a glob over one function's mutants -> verdict "equivalent" or "accepted", and why). The score counts killed and timed-out
mutants over every mutant that is not equivalent; a survivor without a verdict is listed as
"unreviewed" and counts against the score. A run with mutants left unchecked writes nothing.

Usage: python tests/mutation_report.py --out reports/mutation.md   (from the project root)
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import sys
import tomllib
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from c2w_export.env import cpu_name

HERE = Path(__file__).resolve().parent
VERDICTS = HERE / "mutation_verdicts.toml"
KINDS = ("equivalent", "accepted")


def load_results() -> dict[str, tuple[str, str]]:
    """{mutant name: (source path, mutmut status)} for every mutant of every mutated file."""
    from mutmut.stats import status_by_exit_code

    out = {}
    for meta in sorted(Path("mutants").rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        src = str(meta.relative_to("mutants"))[: -len(".meta")]
        for name, code in data["exit_code_by_key"].items():
            out[name] = (src, status_by_exit_code[code])
    return out


def load_verdicts(path: Path = VERDICTS) -> dict[str, dict]:
    table = tomllib.loads(path.read_text()) if path.exists() else {}
    for name, v in table.items():
        if v.get("verdict") not in KINDS or not v.get("why"):
            raise SystemExit(f"{path}: {name} needs verdict = one of {KINDS} and a non-empty why")
    return table


def verdict_of(name: str, verdicts: dict[str, dict]) -> dict:
    """The reviewed verdict of `name`: its own entry, else the first glob entry (a whole function's
    mutants, e.g. a report formatter) that matches it; {} when unreviewed."""
    if name in verdicts:
        return verdicts[name]
    return next((v for k, v in verdicts.items() if "*" in k and fnmatch.fnmatchcase(name, k)), {})


def changed_lines(name: str, src: str) -> str:
    """The mutant's changed lines, '-' then '+', from mutmut's own diff."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=src).splitlines()
    lines = [ln for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return " / ".join(ln[0] + " " + ln[1:].strip() for ln in lines)


UNCHECKED = ("not checked", "check was interrupted by user")


def render(results: dict[str, tuple[str, str]], verdicts: dict[str, dict], minutes: float | None,
           note: str = "") -> str:
    import mutmut

    by_file: dict[str, Counter] = {}
    survivors = []
    for name, (src, status) in sorted(results.items()):
        c = by_file.setdefault(src, Counter())
        c["mutants"] += 1
        if status in UNCHECKED:
            c["unchecked"] += 1
            continue
        if status in ("killed", "timeout", "caught by type check", "segfault"):
            c["killed"] += 1
            continue
        v = verdict_of(name, verdicts)
        c[v.get("verdict", "unreviewed")] += 1
        survivors.append((src, name, status, v.get("verdict", "unreviewed"), v.get("why", "")))
    total = Counter()
    for c in by_file.values():
        total.update(c)
    scored = total["mutants"] - total["equivalent"] - total["unchecked"]
    score = 100.0 * total["killed"] / scored if scored else 0.0
    stale = sorted(k for k in verdicts if not any(fnmatch.fnmatchcase(n, k) for n in results))
    partial = total["unchecked"]
    out = [
        "# Mutation testing" + (" (PARTIAL RUN)" if partial else ""),
        "",
        *([f"**Partial: {partial} of {total['mutants']} mutants were not checked** (the run was stopped); the score "
           "covers the checked ones only and is not comparable with a complete run.", ""] if partial else []),
        f"`tox -e mutation` (mutmut {mutmut.__version__}), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{cpu_name()}, Python {platform.python_version()}"
        + (f", {minutes:.0f} min." if minutes else "."),
        "",
        *([note, ""] if note else []),
        "Tests: the eager tier of the default suite (`--backends eager`, every test file except the benchmarks",
        "and the real-size ones), with the CLI and `verify` tests on a checkpoint and artifacts built once by the",
        "unmutated code (`C2W_ARTIFACT_CACHE`). Each mutant runs its covering tests fastest first within a",
        f"budget of {os.environ.get('C2W_MUTATION_BUDGET_S', '10')} s of their measured time, so a survivor may still be killed by a slower test: the",
        "score is a lower bound.",
        "",
        f"**Score: {total['killed']} of {scored} non-equivalent mutants killed ({score:.1f}%).** "
        f"{total['equivalent']} equivalent, {total['accepted']} accepted, {total['unreviewed']} unreviewed.",
        "",
        "| file | mutants | unchecked | killed | equivalent | accepted | unreviewed | score |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for src, c in sorted(by_file.items()):
        s = c["mutants"] - c["equivalent"] - c["unchecked"]
        out.append(f"| `{src}` | {c['mutants']} | {c['unchecked']} | {c['killed']} | {c['equivalent']} | {c['accepted']} | "
                   f"{c['unreviewed']} | {100.0 * c['killed'] / s if s else 100.0:.1f}% |")
    out += ["", "## Every survivor", "",
            "Verdicts are reviewed by hand in `tests/mutation_verdicts.toml`; mutants killed by a new test do not",
            "appear here (they are in the killed column).", "",
            "| mutant | mutmut status | change | verdict | why |", "|---|---|---|---|---|"]
    for src, name, status, v, why in survivors:
        change = changed_lines(name, src).replace("|", "\\|")
        out.append(f"| `{name.split('.')[-1]}` ({Path(src).name}) | {status} | `{change}` | {v} | {why} |")
    if stale:
        out += ["", f"Verdicts for mutants this run did not produce (the code changed): {', '.join(stale)}."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=None, help="wall time of the run, for the header")
    ap.add_argument("--note", default="", help="how the run was made (e.g. several invocations), printed under the header")
    ap.add_argument("--allow-partial", action="store_true",
                    help="write a run with unchecked mutants anyway, marked PARTIAL (never to reports/mutation.md)")
    a = ap.parse_args(argv)
    results = load_results()
    if not results:
        print("mutation report: no mutmut results under mutants/; nothing written", file=sys.stderr)
        return 2
    unchecked = [n for n, (_, s) in results.items() if s in UNCHECKED]
    if unchecked and a.allow_partial and a.out.name == "mutation.md":
        print("mutation report: a partial run never writes mutation.md; give another --out", file=sys.stderr)
        return 2
    if unchecked and not a.allow_partial:
        print(f"mutation report: {len(unchecked)} mutant(s) not checked (partial run); {a.out} not rewritten",
              file=sys.stderr)
        return 2
    text = render(results, load_verdicts(), a.minutes, a.note)
    a.out.write_text(text)
    print(next(ln for ln in text.splitlines() if ln.startswith("**Score")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
