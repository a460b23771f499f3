"""Write reports/fuzz.md from a finished `tox -e fuzz` run (tests/test_fuzz.py under the fuzz profile).

Reads the per-worker outcome files under --raw (cases per surface and outcome, written at the end of
each worker's session) and the kept counterexamples (test_fuzz.REGRESSIONS and OPTION_REGRESSIONS).
A run that left a surface short of the profile's cases writes nothing: tox runs this only after
pytest passed, and the counts show the run was complete.

Usage: python tests/fuzz_report.py --raw DIR --out reports/fuzz.md --cases-per-surface N
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from c2w_export.env import cpu_name, versions  # noqa: E402

SURFACES = {  # surface -> what is drawn (test_fuzz's tests)
    "manifest.json": "one field deleted, set to an odd value, nudged, duplicated or swapped (decode and verify)",
    "code2wav.pte": "truncated or 1-16 bits flipped, mostly behind a re-hashed manifest (decode and verify)",
    "code2wav.bpte": "truncated or 1-16 bits flipped, mostly behind a re-hashed manifest (verify)",
    "codes .npy": "dtype, byte order, shape, values, Fortran order; truncated, flipped or a header claiming a shape",
    "codes .pt": "tensors of any dtype/shape, views, dicts, lists, ints, a pickled class; flipped bytes",
    "state tensors": "one stateful input replaced (dtype, shape, nan, inf, strided, not a tensor), dropped or added",
    "pushed codes": "codes pushed into an open StreamDecoder, as the state tensors; the stream must be unchanged",
    "config.json": "one field of the checkpoint's config mutated (verify --model)",
    "model.safetensors": "the header's JSON mutated, its length prefix changed, or the file cut (verify --model)",
    "options": "decode --ramp / --variant and verify --windows drawn, valid or not",
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases-per-surface", type=int, required=True, help="the fuzz profile's max_examples")
    args = ap.parse_args()

    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for f in sorted(args.raw.glob("*.json")):
        for row in json.loads(f.read_text()):
            counts[row["surface"]][row["outcome"]] = counts[row["surface"]].get(row["outcome"], 0) + row["cases"]
    short = {s: sum(counts.get(s, {}).values()) for s in SURFACES
             if sum(counts.get(s, {}).values()) < args.cases_per_surface}
    if short:
        print(f"fuzz_report: incomplete run, surfaces short of {args.cases_per_surface} cases: {short}; nothing written",
              file=sys.stderr)
        return 1

    import test_fuzz

    total = sum(sum(c.values()) for c in counts.values())
    v = versions()
    lines = [
        "# Fuzz report (tox -e fuzz)",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC · {cpu_name()} · {platform.system()} · torch {v['torch']} · "
        f"executorch {v['executorch']} · c2w-export {v['c2w_export']}",
        "",
        f"**{total} cases** over {len(SURFACES)} surfaces (the fuzz profile: {args.cases_per_surface} per surface, "
        "derandomized), on the tiny checkpoint (seed 0) and its XNNPACK artifacts (one .pte with both variants, "
        "bundled vectors). Every case held every property: exit 0, 1 or 2, never a traceback or a crash; exit 2 "
        "is one line naming the file; a refused decode wrote no WAV; verify failed whatever decode refused.",
        "",
        "| surface | drawn | cases | outcomes |",
        "|---|---|---|---|",
    ]
    for s, what in SURFACES.items():
        outcomes = ", ".join(f"{o}: {n}" for o, n in sorted(counts[s].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {s} | {what} | {sum(counts[s].values())} | {outcomes} |")
    lines += [
        "",
        "Outcomes: `decode 2` is a refusal in one line, `verify 1` a FAIL row, `ran` a call the library took, "
        "`InputError` one it refused.",
        "",
        "## Counterexamples found, fixed, and kept",
        "",
        "Each is an explicit case in tests/test_fuzz.py, run by `tox -e parity`.",
        "",
        "| case | what it says now | fix |",
        "|---|---|---|",
    ]
    for row in [*test_fuzz.REGRESSIONS, *test_fuzz.OPTION_REGRESSIONS]:
        lines.append(f"| {row[0]} | {row[-1]} | {test_fuzz.FIXES[row[0]]} |")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({total} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
