"""Where a program's time goes: the per-op time of one ExecuTorch method from the runtime's own
trace (ETDump, read with the devtools Inspector). Every op inside the delegate (XNNPACK's convs,
deconvs, GEMMs, ...) and every portable kernel outside it, with its calls and milliseconds per
method call, next to the delegate calls and the method's total.

The first `warmup` calls are left out of the times: the first call of a method sets up the
delegate's runtime and is many times slower than the rest (measured 283 ms against ~45 ms on a
tiny static chunk-2 method)."""

from __future__ import annotations

import re
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from ..program.flows import native_quiet
from ..ship.artifacts import ArtifactError, Artifacts

RUNTIME_EVENTS = ("Method::execute", "DELEGATE_CALL")
WRAPPER = "OPERATOR_CALL"  # the runtime's wrapper around each portable kernel's own event: counted once, by the kernel


@dataclass(frozen=True)
class OpTime:
    op: str  # "Convolution (NHWC, F32) IGEMM", "expand_copy.out", "Method::execute", ...
    where: str  # the delegate ("xnnpack"), "portable" (a kernel outside the delegate) or "runtime"
    calls: int  # per method call
    ms: float  # per method call: the mean over the timed calls

    def to_json(self) -> dict:
        return {"op": self.op, "where": self.where, "calls": self.calls, "ms": self.ms}


def example_inputs(art: Artifacts, method: str, seed: int = 0) -> list[torch.Tensor]:
    """Inputs of `method` from its manifest spec, at its largest chunk: seeded codes, then a full
    history (windowed) or the manifest's start state (stateful)."""
    spec = art.specs[method]
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, art.decode["codebook_size"], spec.inputs[0].shape, generator=g)
    if spec.variant == "stateful":
        return [codes, *art.initial_state()]
    return [codes, torch.full(spec.inputs[1].shape, spec.context, dtype=torch.int64)]  # every history frame real


def summarize(event_blocks, delegate: str, warmup: int) -> list[OpTime]:
    """The Inspector's execute events -> one OpTime per op kind, slowest first. An event's
    `perf_data.raw` holds one time per method call; its name ends in " #<n>" inside the delegate."""
    calls: dict[tuple[str, str], int] = defaultdict(int)
    ms: dict[tuple[str, str], float] = defaultdict(float)
    for block in event_blocks:
        if block.name != "Execute":
            continue
        for e in block.events:
            if e.perf_data is None or e.name == WRAPPER:
                continue
            timed = e.perf_data.raw[warmup:]
            if not timed:
                raise ValueError(f"{e.name}: {len(e.perf_data.raw)} call(s) traced, none after {warmup} warm-up call(s)")
            if e.is_delegated_op:
                key = (re.sub(r" #\d+$", "", e.name), delegate)
            elif e.name in RUNTIME_EVENTS:
                key = (e.name, "runtime")
            else:
                key = (e.name.removeprefix("native_call_"), "portable")
            calls[key] += 1
            ms[key] += sum(timed) / len(timed)
    return sorted((OpTime(op, where, calls[op, where], ms[op, where]) for op, where in calls),
                  key=lambda r: (r.where == "runtime", -r.ms))


def profile_pte(pte: Path, method: str, inputs: list[torch.Tensor], delegate: str = "xnnpack", runs: int = 5,
                warmup: int = 1) -> list[OpTime]:
    """Run `method` of the .pte at `pte` warmup + runs times with ETDump on -> its op times."""
    if runs < 1 or warmup < 0:
        raise ValueError(f"profile needs runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    from executorch.devtools import Inspector
    from executorch.extension.pybindings import portable_lib

    with native_quiet():  # the runtime's cpuinfo lines on first use (the CLI keeps them off stderr)
        module = portable_lib._load_for_executorch(str(pte), enable_etdump=True, debug_buffer_size=0)
        for _ in range(warmup + runs):
            module.run_method(method, inputs)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / f"{method}.etdp"
        module.write_etdump_result_to_file(str(trace))
        blocks = Inspector(etdump_path=str(trace)).event_blocks
    return summarize(blocks, delegate, warmup)


def profile_method(art: Artifacts, method: str, runs: int = 5, warmup: int = 1) -> list[OpTime]:
    """profile_pte on a shipped method, fed example_inputs. Raises ArtifactError naming the
    method when it is unknown or not an ExecuTorch program."""
    entry = next((p for p in art.manifest["programs"] if p["method"] == method), None)
    if entry is None:
        raise ArtifactError(f"no method {method!r} in {art.root}; it holds {sorted(art.specs)}")
    if not entry["path"].endswith(".pte"):
        raise ArtifactError(f"{method} is a {entry['backend']} program ({entry['path']}): "
                            "only ExecuTorch .pte programs carry an ETDump profile")
    return profile_pte(art.root / entry["path"], method, example_inputs(art, method),
                       entry.get("partitioner") or "delegate", runs, warmup)


def shares(rows: list[OpTime], top: int = 5) -> dict:
    """The bench report's summary of one profile: total, time per place, the slowest ops."""
    ops = [r for r in rows if r.where != "runtime"]
    return {"total_ms": next((r.ms for r in rows if r.op == "Method::execute"), 0.0),
            "ms_by_where": {w: sum(r.ms for r in ops if r.where == w) for w in sorted({r.where for r in ops})},
            "calls_by_where": {w: sum(r.calls for r in ops if r.where == w) for w in sorted({r.where for r in ops})},
            "slowest": [r.to_json() for r in ops[:top]]}


def profile_table(method: str, rows: list[OpTime], top: int = 12) -> str:
    """Markdown: the method total, the time per place (shares), then the `top` slowest ops."""
    summary = shares(rows, top)
    total, ops = summary["total_ms"], [r for r in rows if r.where != "runtime"]
    lines = [f"**{method}**: {total:.3f} ms per call"]
    for where, ms in summary["ms_by_where"].items():
        share = f" ({100 * ms / total:.0f}%)" if total else ""
        lines.append(f"- {where}: {summary['calls_by_where'][where]} op call(s), {ms:.3f} ms{share}")
    lines += ["", "| where | op | calls | ms per method call |", "|---|---|---|---|"]
    lines += [f"| {r.where} | {r.op} | {r.calls} | {r.ms:.3f} |" for r in ops[:top]]
    if len(ops) > top:
        lines.append(f"| | {len(ops) - top} more op kind(s) | {sum(r.calls for r in ops[top:])} | "
                     f"{sum(r.ms for r in ops[top:]):.3f} |")
    return "\n".join(lines)
