"""`c2w-export export`: build every chunk program, check each in its own runtime against eager
(windows and whole streams), write artifacts + manifest.json. Over tolerance -> nothing ships.

Everything is built in a staging directory inside `out_dir` and moved into place only when every
program passed, so a failure halfway never leaves a partial manifest or artifact behind.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import manifest as mf
from .checkpoint import load_decoder, sha256_file
from .compare import Diff, compare
from .decoder import Code2Wav
from .flows import Flow, FlowError, get_flow
from .pipeline import ParityError, ProgramResult, build
from .runner import Runner
from .streaming import DEFAULT_RAMP, stream_stateful, stream_windowed
from .variants import VARIANTS, Stateful, make_variant

DEFAULT_CONTEXT = 72


def flow_for(backend: str, partitioner: str | None) -> Flow:
    if backend == "torch_export":
        return get_flow("torch_export")
    if backend == "executorch":
        return get_flow({"xnnpack": "executorch_xnnpack", "portable": "executorch_portable", None: "executorch_xnnpack"}.get(partitioner, partitioner))
    if backend == "eager":
        raise FlowError("eager is the reference, not an artifact backend; use torch_export or executorch")
    raise FlowError(f"unknown backend {backend!r}; choose torch_export or executorch")


class Dispatch:
    """run(method, inputs) over several loaded programs (one per chunk, or one multi-method)."""

    def __init__(self, runners: dict[str, Runner]):
        self.runners = runners

    def run(self, method: str, inputs):
        if method not in self.runners:
            raise FlowError(f"no program for method {method!r}; have {sorted(self.runners)}")
        return self.runners[method].run(method, inputs)


def stream_check(decoder: Code2Wav, run, variants: Sequence[str], ramp: Sequence[int], context: int,
                 frames: int, seed: int) -> dict[str, Diff]:
    """A whole stream through the programs vs eager: stateful vs the offline decode, windowed vs
    the eager windowed stream (same variant; windowed is not exact against offline)."""
    cfg = decoder.config
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, frames), generator=g)
    out = {}
    for v in variants:
        if v == "stateful":
            init = Stateful(decoder, ramp[0]).initial_state()
            got = stream_stateful(run, init, codes, cfg.hop, ramp).wav
            with torch.no_grad():
                ref = decoder(codes)[:, 0]
        else:
            got = stream_windowed(run, codes, cfg.hop, context, ramp).wav
            eager = {f"chunk_{c}": make_variant(decoder, "windowed", c, context) for c in ramp}
            with torch.no_grad():
                ref = stream_windowed(lambda m, x: (eager[m](*x),), codes, cfg.hop, context, ramp).wav
        out[v] = compare(got, ref)
    return out


def export_artifacts(model: str, out_dir: Path, *, ramp: Sequence[int] = DEFAULT_RAMP, context: int = DEFAULT_CONTEXT,
                     backend: str = "executorch", partitioner: str | None = "xnnpack",
                     variants: Sequence[str] = ("windowed",), multi_method: bool = False, windows: int = 3,
                     bundle: bool = False, seed: int = 0, decoder: Code2Wav | None = None,
                     progress: Callable[[str], None] = print) -> dict:
    """Export, check and write. Returns the manifest; raises ParityError (nothing written) when a
    program is over tolerance."""
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; choose from {VARIANTS}")
    ramp = sorted(set(int(c) for c in ramp))
    if not ramp or ramp[0] < 1:
        raise ValueError(f"ramp must hold positive chunk sizes, got {ramp}")
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    flow = flow_for(backend, partitioner)
    reason = flow.skip_reason()
    if reason:
        raise FlowError(f"{flow.name} is unavailable: {reason}")
    decoder = decoder if decoder is not None else load_decoder(model)
    cfg = decoder.config
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=".staging-"))
    try:
        progress(f"exporting {len(variants) * len(ramp)} program(s) with {flow.name}: variants {list(variants)}, "
                 f"ramp {ramp}, context {context}{', one multi-method file' if multi_method else ''}")
        results, loaded = build(decoder, flow, variants, ramp, context, staging, multi_method=multi_method,
                                windows=windows, seed=seed, progress=progress)
        specs = {r.spec.method: r.spec for r in results}
        runners = {m: Runner(flow.name, loaded[m], {m: specs[m]}, cfg.codebook_size) for m in specs}
        stream_frames = sum(ramp) + ramp[-1] + 3  # through the whole ramp, a repeat and a partial chunk
        streams = stream_check(decoder, Dispatch(runners).run, variants, ramp, context, stream_frames, seed + 1000)
        for v, d in streams.items():
            progress(f"stream check {v} ({stream_frames} frames): {d.describe()}")
        failures = [r.failure() for r in results if not r.passed]
        tol = results[0].tolerance
        failures += [f"{flow.name} {v} stream of {stream_frames} frames diverged from eager: {d.describe()} "
                     f"(tolerance max_abs<={tol.max_abs:g}, SNR>={tol.min_snr_db:g} dB)"
                     for v, d in streams.items() if not d.within(tol)]
        if failures:
            raise ParityError("not shipped, over tolerance:\n  " + "\n  ".join(failures))
        bundles = {}
        if bundle:
            from .bundle import write_bundles

            bundles = write_bundles(flow, results, staging, progress)
        manifest = make_manifest(decoder, model, flow, variants, ramp, context, results, streams, staging, bundles)
        for f in staging.iterdir():
            if f.is_file() and not f.name.startswith("."):
                f.replace(out_dir / f.name)
        mf.write(out_dir, manifest)
        progress(f"wrote {len(results)} program(s) and {mf.MANIFEST} to {out_dir}")
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def make_manifest(decoder: Code2Wav, model: str, flow: Flow, variants, ramp, context, results: list[ProgramResult],
                  streams: dict[str, Diff], root: Path, bundles: dict[str, str]) -> dict:
    cfg = decoder.config
    files = getattr(decoder, "checkpoint", None)
    weights_sha = sha256_file(files.weights_path) if files else ""
    hashes: dict[Path, str] = {}
    programs = []
    for r in results:
        path = r.path
        if path not in hashes:
            hashes[path] = sha256_file(path)
        d = r.diff
        programs.append({
            "method": r.spec.method, "variant": r.spec.variant, "chunk": r.spec.chunk, "context": r.spec.context,
            "path": path.name, "sha256": hashes[path], "bytes": path.stat().st_size,
            "inputs": [s.to_json() for s in r.spec.inputs], "outputs": [s.to_json() for s in r.spec.outputs],
            "backend": flow.name, "partitioner": flow.partitioner, "verified": flow.verified,
            "tolerance": r.tolerance.to_json(),
            "parity": {"max_abs": d.max_abs, "snr_db": None if d.snr_db == float("inf") else d.snr_db,
                       "windows": r.windows, "streams": 1, "stream_max_abs": streams[r.spec.variant].max_abs,
                       "stages": {s: x.max_abs for s, x in r.stages.items()}},
            **({"bundle": bundles[r.spec.method]} if r.spec.method in bundles else {}),
        })
    return {
        "format_version": mf.FORMAT_VERSION,
        "model": {"id": str(model), "config_sha256": cfg.canonical_sha256(), "weights_sha256": weights_sha},
        "versions": mf.versions(),
        "decode": {"variants": list(variants), "ramp": list(ramp), "context_frames": context, "hop": cfg.hop,
                   "sample_rate": cfg.output_sample_rate, "num_quantizers": cfg.num_quantizers,
                   "codebook_size": cfg.codebook_size},
        "state": [{"name": n, "shape": list(s), "dtype": str(d).removeprefix("torch.")} for n, s, d in decoder.state_spec()],
        "programs": programs,
    }
