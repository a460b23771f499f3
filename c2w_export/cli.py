"""The `c2w-export` command line. Errors a user can fix exit 2 with one line, no traceback;
a parity failure exits 1."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .model.synth import STRESS
from .program.precision import FP32, PRECISIONS
from .program.streaming import DEFAULT_CONTEXT, DEFAULT_MAX_CHUNK, DEFAULT_RAMP
from .ship.verify import EXIT_OK, EXIT_PARITY

EXIT_USAGE = 2
DEMO_FRAMES = 120  # 9.6 s of audio


class _Version(argparse.Action):
    """--version: the versions a manifest records (env.versions), and this CPU's fp16 arithmetic."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the versions a manifest records and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from .env import cpu_name, fp16_arithmetic, versions

        v = versions()
        print(f"c2w-export {v['c2w_export']} (torch {v['torch']}, executorch {v['executorch']}, Python {v['python']}; "
              f"{cpu_name()}: fp16 arithmetic {fp16_arithmetic()})")
        parser.exit(0)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other error (`-h` shows the usage)."""

    def error(self, message):
        _err(f"{self.prog.removeprefix('c2w-export').strip() or 'usage'}: {message}")
        self.exit(EXIT_USAGE)


def _count(low: int, high: int):
    """An argparse type: an integer in low..high, named in the error."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v} is not in {low}..{high}")
        return v
    return parse


MAX_WINDOWS = 1000  # code windows a check runs per method: past this it is hours, not a check


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="c2w-export", description=__doc__)
    p.add_argument("--version", action=_Version)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also show third-party warnings and logs (torch, torchao, ExecuTorch)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth", help="write a seeded synthetic checkpoint in the real layout")
    s.add_argument("--preset", choices=["tiny", "real"], default="tiny")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True, type=Path)
    s.add_argument("--stress", nargs="+", choices=[*STRESS, "all"], default=[],
                   help="reach what Gaussian weights never do (the output and usage clamps, RMSNorm eps, outliers)")

    e = sub.add_parser("export", help="export, check against eager, write artifacts + manifest.json")
    e.add_argument("--model", required=True, help="model directory or hub id")
    e.add_argument("--out-dir", required=True, type=Path)
    e.add_argument("--max-chunk", type=int, default=DEFAULT_MAX_CHUNK,
                   help="the largest chunk (frames) a call takes: each variant is one method for chunks 1..max")
    e.add_argument("--ramp", type=int, nargs="+", default=list(DEFAULT_RAMP),
                   help="the decode schedule the manifest recommends (sizes within 1..max-chunk)")
    e.add_argument("--context", type=int, default=DEFAULT_CONTEXT)
    e.add_argument("--backend", choices=["torch_export", "executorch"], default="executorch")
    e.add_argument("--partitioner", choices=["xnnpack", "portable"], default="xnnpack")
    e.add_argument("--variant", choices=["windowed", "stateful", "both"], default="windowed")
    e.add_argument("--multi-method", action="store_true", help="one file holding both variants' methods (they share the weights)")
    e.add_argument("--bundle", action="store_true", help="also write BundledProgram (.bpte) test vectors")
    e.add_argument("--windows", type=_count(1, MAX_WINDOWS), default=3, help="code windows checked per program")
    e.add_argument("--precision", choices=sorted(PRECISIONS), default=FP32,
                   help="fp16: float16 weights and activations; fp16-mixed: float16 with the convs and a few "
                        "more parts float32 (what a phone's fp16 arithmetic needs); int8-dynamic: the transformer layers' and "
                        "ConvNeXt linears dynamically quantized (XNNPACK qd8), the convs float32; other int8*: static int8 of the named parts "
                        "(program/precision.py). I/O and state stay float32. Each is gated against its own eager "
                        "reference at that precision and against the fp32 decoder at the precision's quality floor")

    d = sub.add_parser("decode", help="stream codes through shipped artifacts into a 24 kHz WAV")
    d.add_argument("--artifacts", required=True, type=Path)
    d.add_argument("--codes", required=True, type=Path, help=".npy or .pt, int64 [Q,T] or [1,Q,T]")
    d.add_argument("--out", required=True, type=Path)
    d.add_argument("--variant", choices=["windowed", "stateful"], default=None)
    d.add_argument("--ramp", type=int, nargs="+", default=None,
                   help="chunk schedule (default: the manifest's); any sizes within the programs' chunk range")
    d.add_argument("--wav-format", choices=["pcm16", "float32"], default="pcm16",
                   help="16-bit PCM (default) or 32-bit float WAV (the decoder's samples unrounded)")
    d.add_argument("--json", action="store_true", help="print timings (load, per chunk, playback) as JSON")
    d.add_argument("--check", action="store_true", help="also decode offline in eager and print the diff")
    d.add_argument("--model", default=None, help="for --check: model (default: the manifest's)")

    v = sub.add_parser("verify", help="re-hash, load and parity-check an artifacts directory")
    v.add_argument("--artifacts", required=True, type=Path)
    v.add_argument("--model", default=None)
    v.add_argument("--json", action="store_true")
    v.add_argument("--windows", type=_count(1, MAX_WINDOWS), default=3, help="code windows checked per method")

    f = sub.add_parser("profile", help="per-op time of ExecuTorch methods from the runtime's ETDump trace")
    f.add_argument("--artifacts", required=True, type=Path)
    f.add_argument("--method", nargs="+", default=None, help="default: every method of every .pte")
    f.add_argument("--runs", type=_count(1, MAX_WINDOWS), default=5, help="timed calls per method, after one warm-up call")
    f.add_argument("--json", action="store_true")

    g = sub.add_parser("golden", help="check (default) or --update tests/golden (tiny seed 0, plain and stress)")
    g.add_argument("--update", action="store_true")
    g.add_argument("--dir", type=Path, default=None)

    m = sub.add_parser("demo", help="the main job on the embedded default: synth tiny, export, verify, decode")
    m.add_argument("--out", type=Path, default=Path("demo"))
    m.add_argument("--backend", choices=["torch_export", "executorch"], default="executorch")
    return p


def _err(msg: str) -> None:
    """One line, whatever the message holds (a library's error may run to many)."""
    print(f"c2w-export: error: {' '.join(str(msg).split())}", file=sys.stderr)


def quiet_third_party() -> None:
    """Keep torch / torchao / ExecuTorch warnings and log lines out of the terminal (-v shows
    them); our own output is printed, never warned, so none of it is hidden."""
    from .env import quiet_libraries
    from .program import flows

    quiet_libraries()

    flows.QUIET_NATIVE = True


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.verbose:
        quiet_third_party()
    from .model.checkpoint import CheckpointError
    from .model.config import ConfigError
    from .model.validate import InputError
    from .program.flows import FlowError
    from .program.pipeline import ParityError
    from .ship.artifacts import ArtifactError
    from .ship.manifest import ManifestError

    try:
        return int(COMMANDS[args.command](args) or 0)
    except ParityError as e:
        _err(str(e))
        return EXIT_PARITY
    except (InputError, CheckpointError, ConfigError, ManifestError, ArtifactError, FlowError, ValueError, OSError) as e:
        _err(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


def cmd_synth(a) -> int:
    from .model.synth import synth

    t = time.perf_counter()
    stress = STRESS if "all" in a.stress else a.stress
    root = synth(a.preset, a.seed, a.out, stress)
    extra = f" (stress: {', '.join(stress)})" if stress else ""
    print(f"wrote {a.preset} seed {a.seed}{extra} checkpoint to {root} in {time.perf_counter() - t:.1f}s")
    return EXIT_OK


def _variants(v: str) -> list[str]:
    return ["windowed", "stateful"] if v == "both" else [v]


def cmd_export(a) -> int:
    from .ship.export import export_artifacts

    export_artifacts(a.model, a.out_dir, ramp=a.ramp, max_chunk=a.max_chunk, context=a.context, backend=a.backend,
                     partitioner=a.partitioner, variants=_variants(a.variant), multi_method=a.multi_method,
                     windows=a.windows, bundle=a.bundle, precision=a.precision, progress=lambda s: print(s, flush=True))
    return EXIT_OK


def _decode_and_report(artifacts: Path, codes_path: Path, out: Path, variant: str | None, check: bool,
                       model: str | None, ramp: list[int] | None = None, wav_format: str = "pcm16",
                       as_json: bool = False) -> None:
    """Decode a codes file through the artifacts, write the WAV, print timings, the playback
    simulation (and the check), as text or one JSON object."""
    import json

    import torch

    from .program.compare import compare
    from .ship.artifacts import open_artifacts
    from .ship.decode import decode
    from .ship.wav import read_codes, write_wav

    from .model.validate import check_codes

    art = open_artifacts(artifacts)
    codes = read_codes(codes_path)
    check_codes(codes, art.decode["num_quantizers"], art.decode["codebook_size"], name=f"codes in {codes_path}")
    res = decode(art, codes, variant, ramp)
    write_wav(out, res.wav, res.sample_rate, wav_format)
    hop = art.decode["hop"]
    report = {"out": str(out), "wav_format": wav_format, **res.to_json(hop)}
    if check:
        from .model.checkpoint import load_decoder

        decoder = load_decoder(model or art.manifest["model"]["id"])
        with torch.no_grad():
            ref = decoder(codes)[:, 0]
        report["check"] = compare(res.wav, ref).to_json()
        check_text = compare(res.wav, ref).describe()
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"decoded {codes.shape[-1]} frames ({res.audio_seconds:.2f} s) with {res.variant}, ramp {res.ramp}, "
          f"in {len(res.steps)} chunks -> {out} ({wav_format})")
    print(f"load {res.load_seconds * 1e3:.1f} ms (cold start: each .pte first loaded and run once in a "
          f"child process, then every method loaded and run once here, before the first chunk)")
    print(f"real-time factor {res.real_time_factor:.3f} (compute/audio), first chunk {res.first_chunk_seconds * 1e3:.1f} ms "
          f"({res.steps[0].frames} frames, methods already loaded)")
    print(f"playback at 24 kHz from the first chunk: {res.playback(hop).describe()}")
    if check:
        print(f"check vs offline eager decode: {check_text}")


def cmd_decode(a) -> int:
    _decode_and_report(a.artifacts, a.codes, a.out, a.variant, a.check, a.model, a.ramp, a.wav_format, a.json)
    return EXIT_OK


def cmd_verify(a) -> int:
    from .ship.verify import verify

    report = verify(a.artifacts, a.model, windows=a.windows, progress=(lambda s: None) if a.json else print)
    if a.json:
        print(report.to_json())
    else:
        print(report.table())
        print("verify: PASS" if report.exit_code == EXIT_OK else "verify: FAIL")
    return report.exit_code


def cmd_profile(a) -> int:
    import json

    from .report.profile import profile_method, profile_table
    from .ship.artifacts import open_artifacts

    art = open_artifacts(a.artifacts)
    art.require_files()
    methods = a.method or [p["method"] for p in art.manifest["programs"] if p["path"].endswith(".pte")]
    if not methods:
        raise ValueError(f"{a.artifacts} holds no ExecuTorch .pte program to profile")
    profiles = {m: profile_method(art, m, runs=a.runs) for m in methods}
    if a.json:
        print(json.dumps({m: [r.to_json() for r in rows] for m, rows in profiles.items()}, indent=2))
    else:
        print("\n\n".join(profile_table(m, rows) for m, rows in profiles.items()))
    return EXIT_OK


def cmd_golden(a) -> int:
    from .report.golden import check_golden, update_golden

    if a.update:
        print(update_golden(a.dir))
        return EXIT_OK
    ok, text = check_golden(a.dir)
    print(text)
    return EXIT_OK if ok else EXIT_PARITY


def cmd_demo(a) -> int:
    import numpy as np

    from .model.synth import synth
    from .ship.export import export_artifacts
    from .ship.verify import verify

    out = a.out
    model = out / "model"
    print(f"[1/4] synthetic tiny checkpoint (seed 0) -> {model}")
    synth("tiny", 0, model)
    arts = out / "artifacts"
    ramp = " ".join(map(str, DEFAULT_RAMP))
    print(f"[2/4] export both variants, chunks 1..{DEFAULT_MAX_CHUNK} (decode ramp {ramp}), context {DEFAULT_CONTEXT} "
          f"({a.backend}) -> {arts}")
    export_artifacts(str(model), arts, backend=a.backend, variants=["windowed", "stateful"], multi_method=a.backend == "executorch",
                     progress=lambda s: print("      " + s, flush=True))
    print(f"[3/4] verify {arts}")
    report = verify(arts, progress=lambda s: None)
    print(report.table())
    codes_path = out / "codes.npy"
    rng = np.random.default_rng(0)
    np.save(codes_path, rng.integers(0, 2048, size=(16, DEMO_FRAMES), dtype=np.int64))
    print(f"[4/4] decode {codes_path} ({DEMO_FRAMES} frames = {DEMO_FRAMES * 0.08:.1f} s) -> {out / 'demo.wav'}")
    _decode_and_report(arts, codes_path, out / "demo.wav", "stateful", True, None)
    return report.exit_code


COMMANDS = {"synth": cmd_synth, "export": cmd_export, "decode": cmd_decode, "verify": cmd_verify,
            "profile": cmd_profile, "golden": cmd_golden, "demo": cmd_demo}

if __name__ == "__main__":
    sys.exit(main())
