"""Which parts of the fp16 decoder lose the most under native fp16 arithmetic (issue 31): each part kept
in float32 alone, the rest in float16 computed as a phone computes it (the eager emulation,
program/native_fp16.py), against the fp32 decoder; then the parts kept cumulatively, in the order of
their gains. Written only when every row was measured.

A part's `pte_bytes` is what keeping it in float32 adds to an XNNPACK program: 2 bytes for each of its
weights, which an fp16 program stores in float16 (conv weights too: program/fp16_weights.py).

Usage: python -m c2w_export.report.sensitivity --model DIR --out reports/real/fp16-sensitivity.md [--frames 25]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..env import cpu_name, versions
from ..fileio import atomic_write_bytes
from ..model.checkpoint import load_decoder
from ..model.decoder import Code2Wav
from ..program.codes import random_codes
from ..program.compare import compare
from ..program.native_fp16 import NativeFp16
from ..program.precision import PRECISIONS, to_half
from ..program.prepare import prepare

# readable id -> module paths of the prepared decoder, in data-path order
PARTS: dict[str, tuple[str, ...]] = {
    "rvq.tables": ("quantizer.rvq_first", "quantizer.rvq_rest"),  # the folded codebooks and their output projections
    "rvq.output_proj": ("quantizer.rvq_first.output_proj", "quantizer.rvq_rest.output_proj"),
    "pre_conv": ("pre_conv",),
    "transformer.input_proj": ("pre_transformer.input_proj",),
    "transformer.layers": ("pre_transformer.layers",),
    "transformer.norm+output_proj": ("pre_transformer.norm", "pre_transformer.output_proj"),
    "upsample.0.tconv": ("upsample.0.0",),
    "upsample.0.convnext": ("upsample.0.1",),
    "upsample.1.tconv": ("upsample.1.0",),
    "upsample.1.convnext": ("upsample.1.1",),
    "decoder.conv_in": ("decoder.0",),
    "decoder.block1": ("decoder.1",),
    "decoder.block2": ("decoder.2",),
    "decoder.block3": ("decoder.3",),
    "decoder.block4": ("decoder.4",),
    "decoder.conv_out": ("decoder.5", "decoder.6"),
}


def pte_bytes(prepared: Code2Wav, paths: Sequence[str]) -> int:
    """Bytes that keeping `paths` in float32 adds to an XNNPACK fp16 program: 2 per floating-point weight
    and buffer (a folded transposed conv's phases included). Shared tensors counted once."""
    seen: set[int] = set()
    total = 0
    modules = dict(prepared.named_modules())
    for path in paths:
        for m in modules[path].modules():
            for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
                if id(t) in seen or not t.is_floating_point():
                    continue
                seen.add(id(t))
                total += 2 * t.numel()
    return total


def snr(prepared: Code2Wav, reference: torch.Tensor, codes: torch.Tensor, fp32: Sequence[str],
        upcast: bool = True) -> float:
    """SNR (dB) of the offline decode of `codes` by to_half(prepared, fp32, upcast) with native fp16
    arithmetic (emulated) against `reference` (the fp32 decode, [1, 1, T*hop])."""
    half = to_half(prepared, tuple(fp32), upcast)
    with torch.no_grad(), NativeFp16():
        wav, _ = half.step(codes, {})
    return compare(wav.float(), reference).snr_db


def measure(decoder: Code2Wav, frames: int, seed: int = 3, chosen: str = "fp16-mixed",
            progress: Callable[[str], None] = print) -> dict:
    """Every part alone, then cumulatively in the order of their gains, then `chosen`'s parts
    (precision.PRECISIONS) with its own norms-and-softmax setting."""
    prepared = prepare(decoder)
    codes = random_codes(decoder.config.num_quantizers, frames, decoder.config.codebook_size, seed)
    with torch.no_grad():
        reference, _ = prepared.step(codes, {})

    def run(label: str, paths: Sequence[str], upcast: bool = True) -> dict:
        t0 = time.perf_counter()
        row = {"label": label, "paths": list(paths), "upcast": upcast, "snr_db": snr(prepared, reference, codes, paths, upcast),
               "pte_bytes": pte_bytes(prepared, paths)}
        progress(f"  {label}: {row['snr_db']:.1f} dB ({time.perf_counter() - t0:.0f} s)")
        return row

    base = run("none (fp16 throughout)", ())
    alone = [run(k, v) for k, v in PARTS.items()]
    order = sorted(alone, key=lambda r: -r["snr_db"])
    cumulative, paths = [], []
    for r in order:
        paths += r["paths"]
        cumulative.append(run("+ " + r["label"], list(dict.fromkeys(paths))))
    p = PRECISIONS[chosen]
    final = [run(f"{chosen}", p.fp32, p.upcast)]
    return {"frames": frames, "seed": seed, "base": base, "alone": alone, "cumulative": cumulative, "chosen": final,
            "fp16_params_bytes": 2 * sum(t.numel() for t in prepared.state_dict().values() if t.is_floating_point())}


def table(m: dict, config: str) -> str:
    v = versions()
    mb = lambda b: f"{b / 1e6:.1f}"  # noqa: E731
    db = lambda x: "exact" if x == float("inf") else f"{x:.1f}"  # noqa: E731
    lines = [f"# fp16 sensitivity: which parts lose the most under native fp16 arithmetic ({config} config, "
             "seeded synthetic weights)", "",
             f"Machine: {cpu_name()}, {torch.get_num_threads()} torch thread(s). torch {v['torch']}, c2w_export "
             f"{v['c2w_export']}. Native fp16 arithmetic is emulated (program/native_fp16.py) on every CPU here, so "
             "these numbers do not depend on the machine.", "",
             f"The offline decode of one {m['frames']}-frame window (codes seed {m['seed']}) by the prepared decoder "
             "in float16 with the named parts in float32, against the fp32 decode. Norms and softmax in float32 unless "
             "the row says otherwise. +MB: what keeping the part in float32 adds to an XNNPACK .pte (conv weights add "
             "nothing: they are float32 in the .pte either way).", "",
             f"fp16 throughout: **{m['base']['snr_db']:.1f} dB**.", "",
             "## Each part alone in float32", "", "| part | dB | gain dB | +MB |", "|---|---|---|---|"]
    for r in m["alone"]:
        lines.append(f"| {r['label']} | {r['snr_db']:.1f} | {r['snr_db'] - m['base']['snr_db']:+.1f} | {mb(r['pte_bytes'])} |")
    lines += ["", "## Kept cumulatively, largest gain first", "", "| kept so far | dB | +MB |", "|---|---|---|"]
    lines += [f"| {r['label']} | {db(r['snr_db'])} | {mb(r['pte_bytes'])} |" for r in m["cumulative"]]
    lines += ["", "## The shipped mixed precision", "", "| precision | float32 modules | norms and softmax | dB | +MB |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {', '.join(r['paths'])} | {'float32' if r['upcast'] else 'float16'} | {r['snr_db']:.1f} | "
              f"{mb(r['pte_bytes'])} |" for r in m["chosen"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--frames", type=int, default=25)
    a = p.parse_args(argv)
    decoder = load_decoder(a.model)
    m = measure(decoder, a.frames, progress=lambda s: print(s, flush=True))
    config = "real" if decoder.config.decoder_dim >= 1024 else "tiny"
    atomic_write_bytes(a.out, table(m, config).encode())  # only after every row ran
    atomic_write_bytes(a.out.with_suffix(".json"), (json.dumps(m, indent=1) + "\n").encode())
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
