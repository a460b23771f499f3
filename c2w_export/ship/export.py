"""`c2w-export export`: build one program per variant (one method, any chunk 1..max_chunk), check
each in its own runtime against eager (windows of drawn chunk sizes and whole streams), write
artifacts + manifest.json. Over tolerance -> nothing ships.

Everything is built in a staging directory inside `out_dir` and moved into place only when every
program passed, so a failure halfway never leaves a partial manifest or artifact behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Sequence

from ..env import cpu_name, describe_arithmetic
from ..model.checkpoint import load_decoder
from ..model.decoder import Code2Wav
from ..program.flows import FlowError, ModuleLoaded, flow_for
from ..program.pipeline import QUALITY, ParityError, build
from ..program.precision import FP32, get_precision, with_precision
from ..program.tolerances import BUNDLE_STATE_RTOL
from ..program.runner import Dispatch, Runner
from ..program.streaming import DEFAULT_CONTEXT, DEFAULT_MAX_CHUNK, DEFAULT_RAMP, check_ramp, stream_check, stream_frames
from ..program.variants import VARIANTS
from . import manifest as mf
from .commit import CommitError, commit, kill_point, staging_for


def export_artifacts(model: str, out_dir: Path, *, ramp: Sequence[int] = DEFAULT_RAMP, max_chunk: int = DEFAULT_MAX_CHUNK,
                     context: int = DEFAULT_CONTEXT,
                     backend: str = "executorch", partitioner: str | None = "xnnpack",
                     variants: Sequence[str] = ("windowed",), multi_method: bool = False, windows: int = 3,
                     bundle: bool = False, seed: int = 0, decoder: Code2Wav | None = None,
                     precision: str = FP32, progress: Callable[[str], None] = print) -> dict:
    """Export the checkpoint `model` (or `decoder`, a modified copy of it), check every program and
    whole streams against the checkpoint's eager decoder, and write. Returns the manifest; raises
    ParityError (nothing written) when a program is over tolerance. `ramp` is the decode schedule
    the manifest recommends (any sizes within 1..max_chunk); it is also the export's stream check.

    A reduced `precision` (program/precision.py) is held to both of its gates: every program and
    stream against its own eager reference at that precision, and against the fp32 decoder at the
    precision's quality floor."""
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; choose from {VARIANTS}")
    if max_chunk < 1:
        raise ValueError(f"max_chunk must be >= 1, got {max_chunk}")
    ramp = check_ramp(ramp, max_chunk)
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    flow = with_precision(flow_for(backend, partitioner), precision)
    reason = flow.unavailable()
    if reason:
        raise FlowError(f"{flow.name} is unavailable: {reason}")
    if bundle and flow.backend != "executorch":
        raise FlowError("--bundle needs the executorch backend (BundledProgram wraps a .pte)")
    key = get_precision(precision).key
    if bundle and "stateful" in variants and key not in BUNDLE_STATE_RTOL:
        raise FlowError(f"--bundle of stateful {precision} programs has no measured state tolerance; bundles are "
                        f"measured for {sorted(k for k in BUNDLE_STATE_RTOL)}")
    reference = load_decoder(model)
    decoder = decoder if decoder is not None else reference
    cfg = decoder.config
    out_dir = Path(out_dir)
    try:
        staging = staging_for(out_dir)  # beside out_dir: committed in one step (ship/commit.py)
    except CommitError as e:
        raise FlowError(str(e)) from None
    try:
        kill_point("staged")
        progress(f"exporting {len(variants)} {precision} program(s) with {flow.name}: variants {list(variants)}, "
                 f"chunks 1..{max_chunk}, context {context}, decode ramp {ramp}"
                 f"{', one multi-method file' if multi_method else ''}")
        if precision != FP32:  # side 1 of a half precision is gated for the arithmetic of the CPU it runs on
            progress(f"{precision} arithmetic on this CPU ({cpu_name()}): "
                     f"{describe_arithmetic(get_precision(precision).arithmetic())}")
        results, loaded = build(decoder, flow, variants, max_chunk, context, staging, multi_method=multi_method,
                                windows=windows, seed=seed, progress=progress, reference=reference)
        kill_point("built")
        runners = {r.spec.method: Runner(flow.name, loaded[r.spec.method], {r.spec.method: r.spec}, cfg.codebook_size)
                   for r in results}
        frames = stream_frames(ramp, 3, context if "windowed" in variants else 0)
        # reduced precision: side 2 (vs the fp32 decode) at the quality floor, side 1 vs the own reference's stream;
        # fp32 has no quality gate, so gate(QUALITY) is its one tolerance
        reduced = precision != FP32
        own = ModuleLoaded({r.spec.method: r.own for r in results}).run if reduced else None
        streams = stream_check(reference, Dispatch(runners).run, variants, ramp, context, frames, seed + 1000,
                               results[0].gate(QUALITY), own,
                               results[0].tolerance, f"its own {precision} eager")
        for s in streams:
            progress(f"stream check ({frames} frames) {s.describe()} -> {'ok' if s.passed else 'OVER TOLERANCE'}")
        failures = [r.failure() for r in results if not r.passed]
        failures += [f"{flow.name} stream of {frames} frames, {s.describe()}" for s in streams if not s.passed]
        if failures:
            raise ParityError("not shipped, over tolerance:\n  " + "\n  ".join(failures))
        bundles = {}
        if bundle:
            from .bundle import write_bundles

            bundles = write_bundles(results, progress, reference)
        manifest = mf.build(reference, model, flow, variants, ramp, max_chunk, context, results, streams, bundles)
        for f in staging.iterdir():  # what the build left beside the programs (lowering scratch) is not shipped
            if f.name.startswith(".") or not f.is_file():
                shutil.rmtree(f) if f.is_dir() else f.unlink()
        mf.write(staging, manifest)
        kill_point("manifest")
        commit(staging, out_dir)
        progress(f"wrote {len(results)} program(s) and {mf.MANIFEST} to {out_dir}")
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)
