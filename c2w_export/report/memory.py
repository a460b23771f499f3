"""Where an artifact's memory goes, from the kernel's own counters (/proc/self/status), in phases:
loading (opening the file and the method: XNNPACK packs the weights) and running. The kernel's peak
(VmHWM) is reset between the phases (/proc/self/clear_refs), so the running peak does not hide a
load-time transient, and resident memory is split into anonymous (private: packed weights,
activations) and file-backed (mapped files: the libraries and the .pte's pages, clean, which the
kernel can drop once unmapped). Usage, in a fresh process: python -m c2w_export.report.memory FLOW PTE METHOD INPUTS.pt"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
KEYS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def status() -> dict[str, int]:
    """This process's {VmRSS, VmHWM, RssAnon, RssFile} in kB."""
    found = {}
    for line in STATUS.read_text().splitlines():
        key, _, value = line.partition(":")
        if key in KEYS:
            found[key] = int(value.split()[0])
    missing = [k for k in KEYS if k not in found]
    if missing:
        raise RuntimeError(f"{STATUS} has no {', '.join(missing)} (not Linux?)")
    return found


def reset_peak() -> None:
    """Set VmHWM back to the current RSS (writing 5 to clear_refs, Linux >= 4.0)."""
    CLEAR_REFS.write_text("5")


def phases(load: Callable[[], object], run: Callable[[], object]) -> dict:
    """Memory of `load()` then `run()` in this process, in kB: base (before loading), the load peak
    and what stays after it (anonymous / file-backed), then the peak while running (VmHWM reset
    after loading), and the seconds each phase took."""
    reset_peak()
    base = status()
    t = time.perf_counter()
    load()
    load_s = time.perf_counter() - t
    loaded = status()
    reset_peak()
    t = time.perf_counter()
    run()
    run_s = time.perf_counter() - t
    ran = status()
    return {"base_kb": base["VmRSS"], "base_anon_kb": base["RssAnon"], "load_peak_kb": loaded["VmHWM"],
            "load_kb": loaded["VmRSS"], "load_anon_kb": loaded["RssAnon"], "load_file_kb": loaded["RssFile"],
            "run_peak_kb": ran["VmHWM"], "run_anon_kb": ran["RssAnon"], "load_s": load_s, "run_s": run_s}


def main(argv: list[str]) -> None:
    """FLOW PTE METHOD INPUTS.pt: print one JSON line of phases() for loading METHOD and calling it
    5 times, plus the seconds of the warm-up call (the first: what `Dispatch.preload(warm=True)` runs
    before a stream), of the first call after it, and the median of the 3 after that (warm). The base
    includes the flow's runtime, imported first."""
    import torch

    from ..program.flows import get_flow, runtime

    flow, path, method, inputs_path = argv
    inputs = torch.load(inputs_path)
    if flow.startswith("executorch"):
        runtime()  # the runtime's libraries belong to the base, not to the artifact
    holder, calls = {}, []

    def load():
        holder["loaded"] = get_flow(flow).open({method: Path(path)})
        holder["loaded"].preload([method])

    def run():
        for _ in range(5):
            t = time.perf_counter()
            holder["loaded"].run(method, inputs)
            calls.append(time.perf_counter() - t)

    measured = phases(load, run)
    print(json.dumps({**measured, "warm_up_s": calls[0], "first_call_s": calls[1], "warm_call_s": sorted(calls[2:])[1]}))


if __name__ == "__main__":
    main(sys.argv[1:])
