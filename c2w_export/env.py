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
