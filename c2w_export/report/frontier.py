"""The size/quality frontier: for each precision (program/precision.py), one stateful XNNPACK
program of a few chunk sizes built through the gated pipeline, with its bytes, both gate sides, a
whole stream against the fp32 offline decode, the stream's real-time factor and first audio, and
its delegation. Written only when every precision was measured.

Usage: python -m c2w_export.report.frontier --model DIR --out reports/real/frontier.md
           [--precisions fp32 fp16 int8 ...] [--chunks 2 25] [--frames 77]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..env import cpu_name, fp16_arithmetic, int8_instructions, versions
from ..fileio import atomic_write_bytes
from ..model.checkpoint import load_decoder
from ..model.decoder import Code2Wav
from ..program.codes import random_codes
from ..program.compare import compare
from ..program.flows import FLOWS, FlowError
from ..program.pipeline import NATIVE, build
from ..program.precision import PRECISIONS, get_precision, with_precision
from ..program.runner import Dispatch, Runner
from ..program.streaming import stream_stateful
from ..program.variants import initial_state

GOALS = ("int8: <= 0.3x the fp32 bytes at >= 25 dB; fp16: <= 0.8x the bytes at >= 40 dB with native fp16 arithmetic, "
         "<= 10 partitions, RTF no worse than fp32 (issue 31; dB vs the fp32 eager decoder)")


def fp16_goals(row: dict, fp32: dict) -> list[tuple[str, bool]]:
    """Issue 31's goals for a half-precision row, each (what was measured against what, met?)."""
    ratio = row["bytes"] / fp32["bytes"]
    return [(f"{ratio:.3f}x the fp32 bytes (<= 0.8x)", ratio <= 0.8),
            (f"{row['native_snr_db']:.1f} dB with native fp16 arithmetic (>= 40 dB)", row["native_snr_db"] >= 40),
            (f"{row['partitions']} partitions (<= 10)", row["partitions"] <= 10),
            (f"RTF {row['rtf']:.3f} against fp32's {fp32['rtf']:.3f} (no worse)", row["rtf"] <= fp32["rtf"])]


def measure(decoder: Code2Wav, precision: str, chunks: Sequence[int], frames: int, seed: int = 5,
            progress: Callable[[str], None] = print) -> dict:
    """One row: build `precision`'s stateful XNNPACK program (chunks 1..max(chunks)) and stream
    `frames` frames through it with the ramp `chunks`."""
    flow = with_precision(FLOWS["executorch_xnnpack"], precision)
    t0 = time.perf_counter()
    results, loaded = build(decoder, flow, ["stateful"], max(chunks), 0, None, multi_method=True, progress=progress)
    build_s = time.perf_counter() - t0
    cfg = decoder.config
    runner = Runner(flow.name, loaded[results[0].spec.method], {r.spec.method: r.spec for r in results}, cfg.codebook_size)
    run = Dispatch({r.spec.method: runner for r in results}).run
    codes = random_codes(cfg.num_quantizers, frames, cfg.codebook_size, seed)
    stream_stateful(run, initial_state(decoder), codes[:, :, :chunks[0]], cfg.hop, chunks)  # warm-up call
    res = stream_stateful(run, initial_state(decoder), codes, cfg.hop, chunks)
    with torch.no_grad():
        offline = decoder(codes)[:, 0]
    stream = compare(res.wav, offline)
    worst = min(results, key=lambda r: (r.quality or r.diff).snr_db)
    return {
        "precision": precision, "what": get_precision(precision).what, "chunks": list(chunks),
        "arithmetic": get_precision(precision).arithmetic(),
        "native_snr_db": min(r.stages[NATIVE].snr_db for r in results) if NATIVE in results[0].stages else None,
        "bytes": results[0].bytes, "passed": all(r.passed for r in results),
        "own_snr_db": min(r.diff.snr_db for r in results) if results[0].own is not None else None,
        "quality_snr_db": (worst.quality or worst.diff).snr_db,
        "stream_snr_db": stream.snr_db, "stream_max_abs": stream.max_abs,
        "rtf": res.real_time_factor(cfg.output_sample_rate), "first_audio_ms": res.first_chunk_seconds * 1e3,
        "partitions": results[0].delegation.get("partitions"), "outside_ops": results[0].delegation.get("outside_ops"),
        "plan_bytes": results[0].plan_bytes,
        "build_s": build_s, "failure": "; ".join(r.failure() for r in results if not r.passed),
    }


def _fmt_mb(n: int | None) -> str:
    return "-" if not n else f"{n / 1e6:.1f}"


def table(rows: Sequence[dict], config: str, frames: int) -> str:
    fp32 = next((r["bytes"] for r in rows if r["precision"] == "fp32" and "bytes" in r), None)
    v = versions()
    lines = [f"# Size/quality frontier ({config} config, seeded synthetic weights)", "",
             f"Machine: {cpu_name()} (fp16 arithmetic: {fp16_arithmetic()}; int8 dot-product instructions: "
             f"{int8_instructions()}), {torch.get_num_threads()} torch thread(s). torch {v['torch']}, executorch "
             f"{v['executorch']}, c2w_export {v['c2w_export']}. Compare the rows with each other, not with other runs.", "",
             f"One stateful XNNPACK program per precision (chunks {rows[0]['chunks']}), built through the gated "
             f"pipeline; a {frames}-frame stream with the ramp {rows[0]['chunks']} (after one warm-up call). "
             f"Goals: {GOALS}.", "",
             "Quality is against the fp32 eager decoder: per call (the gate's side 2, worst method) and over the "
             "whole stream vs the offline decode. Own: the program against its own eager reference at that "
             "precision (side 1, worst method). Gates: the tolerance table's entries for the precision.", "",
             "Arithmetic: what the precision's XNNPACK kernels computed in on this CPU (fp16: env.FP16_ARITHMETICS). "
             "Native fp16 dB: the own reference with native fp16 arithmetic (emulated, program/native_fp16.py) against "
             "fp32, per call, worst method: what a phone gets.", "",
             "| precision | quantized | arithmetic | .pte MB | x fp32 bytes | own dB | quality dB | native fp16 dB "
             "| stream dB | RTF | first audio ms | partitions | ops outside | memory plan MB | gates |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['precision']} | {r['what']} | - | - | - | - | - | - | - | - | - | - | - | - | not built: {r['error']} |")
            continue
        ratio = f"{r['bytes'] / fp32:.2f}" if fp32 else "-"
        own = "-" if r["own_snr_db"] is None else f"{r['own_snr_db']:.1f}"
        native = "-" if r.get("native_snr_db") is None else f"{r['native_snr_db']:.1f}"
        lines.append(f"| {r['precision']} | {r['what']} | {r.get('arithmetic', '-')} | {r['bytes'] / 1e6:.1f} | {ratio} | "
                     f"{own} | {r['quality_snr_db']:.1f} | {native} | {r['stream_snr_db']:.1f} | {r['rtf']:.3f} | {r['first_audio_ms']:.1f} | "
                     f"{r['partitions']} | {r['outside_ops']} | {_fmt_mb(r.get('plan_bytes'))} | {'pass' if r['passed'] else 'FAIL'} |")
    base = next((r for r in rows if r["precision"] == "fp32" and "bytes" in r), None)
    halves = [r for r in rows if "error" not in r and r.get("native_snr_db") is not None]
    if base and halves:
        lines += ["", "fp16 goals, row by row (measured on this machine; native fp16 emulated unless the arithmetic column "
                  "says native-fp16):", ""]
        lines += [f"- {r['precision']}: " + "; ".join(f"{what}: {'met' if ok else 'MISSED'}" for what, ok in fp16_goals(r, base))
                  for r in halves]
    fails = [r for r in rows if "error" not in r and not r["passed"]]
    if fails:
        lines += ["", "Gate failures (the exporter refuses to ship these):", ""]
        lines += [f"- {r['precision']}: {r['failure']}" for r in fails]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=sorted(PRECISIONS))
    p.add_argument("--chunks", type=int, nargs="+", default=[2, 25])
    p.add_argument("--frames", type=int, default=77)
    a = p.parse_args(argv)
    decoder = load_decoder(a.model)
    rows = []
    for name in a.precisions:
        try:
            rows.append(measure(decoder, name, a.chunks, a.frames, progress=lambda s: print(s, flush=True)))
        except FlowError as e:  # a precision that cannot be built or run is a row too, with why
            rows.append({"precision": name, "what": get_precision(name).what, "chunks": list(a.chunks), "error": str(e)})
        print(json.dumps(rows[-1]), flush=True)
    config = "real" if decoder.config.decoder_dim >= 1024 else "tiny"
    atomic_write_bytes(a.out, table(rows, config, a.frames).encode())  # only after every precision ran
    atomic_write_bytes(a.out.with_suffix(".json"), (json.dumps(rows, indent=1) + "\n").encode())
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
