"""What this runs on: package versions and the CPU, recorded in manifests and named in every report
(machines differ between runs, so numbers are only comparable within one)."""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path
from typing import Any

__version__ = "0.2.0"


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (e.g. 'AMD EPYC'), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# How XNNPACK's f16 kernels compute on a CPU (tolerances.py holds a side-1 gate for each): the name
# recorded in manifests and reports -> what it means.
FP16_ARITHMETICS = {
    "native-fp16": "half-precision arithmetic: XNNPACK's f16 kernels accumulate in fp16 (x86 AVX512-FP16; "
                   "ARMv8.2 FP16, as on phones)",
    "fp32-accumulate": "no half-precision arithmetic: XNNPACK's f16 kernels convert to float32 and accumulate there "
                       "(x86 F16C)",
}
# CPU flags (/proc/cpuinfo `flags` on x86, `Features` on arm64), any one set of which makes XNNPACK select its
# native f16 GEMM kernels: cpuinfo's x86 avx512fp16 (CPUID and OS state) and arm64 fp16arith (both hwcaps);
# XNNPACK src/configs/hardware-config.c. XNNPACK has no API that reports its choice.
NATIVE_FP16_FLAGS = ({"avx512_fp16"}, {"fphp", "asimdhp"})


# The CPU's int8 dot-product instructions that XNNPACK has qs8/qd8 GEMM kernels for (src/configs/gemm-config.c),
# fastest first: /proc/cpuinfo flag -> name. Which one XNNPACK picks it does not report; this says what the CPU has.
INT8_INSTRUCTIONS = {"amx_int8": "AMX-INT8", "avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI",
                     "i8mm": "I8MM", "asimddp": "SDOT"}


def int8_instructions(flags: set[str] | None = None) -> str:
    """The INT8_INSTRUCTIONS names this CPU has (default: this machine's), fastest first, or 'plain'
    (int8 multiplies without a dot-product instruction)."""
    flags = cpu_flags() if flags is None else flags
    return ", ".join(name for flag, name in INT8_INSTRUCTIONS.items() if flag in flags) or "plain"


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo text (default: this machine's; empty when unreadable)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def fp16_arithmetic(flags: set[str] | None = None, system: str | None = None, machine: str | None = None) -> str:
    """The FP16_ARITHMETICS name for a CPU with these flags (default: this machine's). Apple's arm64
    CPUs all have half arithmetic but no /proc/cpuinfo."""
    system, machine = system or platform.system(), machine or platform.machine()
    if system == "Darwin" and machine == "arm64":
        return "native-fp16"
    flags = cpu_flags() if flags is None else flags
    return "native-fp16" if any(need <= flags for need in NATIVE_FP16_FLAGS) else "fp32-accumulate"


def describe_arithmetic(name: str) -> str:
    """What an arithmetic name means (FP16_ARITHMETICS), or the name itself (int8, float32)."""
    return FP16_ARITHMETICS.get(name, name)


def quiet_libraries() -> None:
    """Third-party warnings ignored (ours still shown) and the torch / torchao / ExecuTorch loggers
    at ERROR: the CLI without -v, and the lowering worker processes it starts."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"c2w_export(\.|$)")
    for name in ("torch", "torchao", "executorch"):
        logging.getLogger(name).setLevel(logging.ERROR)


def versions() -> dict[str, Any]:
    """torch, executorch (None when not installed), c2w_export and Python versions."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:
        et = version("executorch")
    except PackageNotFoundError:
        et = None
    return {"torch": torch.__version__, "executorch": et, "c2w_export": __version__, "python": platform.python_version()}
