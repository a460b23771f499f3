"""reports/arm64.md: the shipped programs on emulated aarch64 (tests/test_arm64.py), from a complete run."""

from __future__ import annotations

from pathlib import Path


def write(rows: list[dict], path: Path, runtime: dict, host_cpu: str) -> None:
    """rows: one per (CPU model, precision, variant): side 1, quality and x86 distance of its calls' audio."""
    lines = [
        "# The shipped programs on aarch64 (QEMU user mode)", "",
        f"ExecuTorch {runtime.get('executorch')} for aarch64 with torch {runtime.get('torch')}, under "
        f"{runtime.get('qemu')}; host {host_cpu}. Runtime: {runtime.get('bytes', 0) / 2**30:.2f} GiB on disk, "
        f"prepared in {runtime.get('seconds', 0):.0f} s (`tox -e arm64`, once). Written by a complete "
        "`tox -e arm64` run (tests/test_arm64.py); every row passed its gates.", "",
        "Each program ran windows at drawn chunk sizes and histories (windowed) or one irregular stream carrying its "
        "own state (stateful), in one aarch64 process per CPU model. Side 1 is the program against its own reference "
        "(fp32: the fp32 eager decoder) at the XNNPACK gate of the model's fp16 arithmetic; quality is against the fp32 "
        "eager decoder (for fp16 on a model with FEAT_FP16, beside what the native-fp16 emulation, "
        "`program/native_fp16.py`, predicted for the same calls: they must agree within 1 dB); x86 is the same program run on the host. Time is the ARM calls' over the host's for the same "
        "calls: QEMU is no phone, so only this ratio is shown.", "",
        "| CPU model | fp16 arithmetic | precision | variant | code frames per call | side 1 | vs fp32 SNR dB "
        "| emulated native fp16 vs fp32 dB | vs x86: max abs | vs x86: SNR dB | time, x host |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["cpu"], r["precision"], r["variant"])):
        lines.append(f"| {r['cpu']} | {r['arithmetic']} | {r['precision']} | {r['variant']} | "
                     f"{', '.join(map(str, r['frames']))} | {r['side1']} | {r['quality_snr']:.1f} | "
                     f"{'' if r['emulated_snr'] is None else format(r['emulated_snr'], '.1f')} | "
                     f"{r['x86_max']:.2e} | {r['x86_snr']:.1f} | {r['slower']:.0f}x |")
    path.write_text("\n".join(lines) + "\n")
