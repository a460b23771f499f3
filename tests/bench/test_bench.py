"""Benchmarks per flow, variant and chunk (tox -e bench): each variant is one program for every
chunk, called at each ramp chunk. One benchmarked call per test; our
numbers (RTF, first audio, FLOPs, RSS, export time, bytes, the context study) go to
reports/bench-extra.json and then into reports/bench.md by `python -m c2w_export.report.bench`."""

import json
import subprocess
import sys

import pytest
import torch

from c2w_export.program.compare import compare
from c2w_export.program.flows import ModuleLoaded
from c2w_export.program.streaming import StreamResult, stream_stateful, stream_windowed
from c2w_export.program.variants import example_inputs, make_variant, method_name
from c2w_export.report.flops import flops_per_audio_second, offline_flops_per_audio_second
from helpers import codes, initial_state

pytestmark = pytest.mark.bench
VARIANTS = ("windowed", "stateful")
STREAM_SECONDS = 20
CONTEXTS = (0, 8, 25, 48, 72, 144)
SCHEDULES = ((1, 2, 4, 8, 16, 25), (2, 4, 8, 16, 25), (4, 8, 16, 25))  # first-audio schedule candidates


def stream_of(run, variant: str, state, c, hop: int, context: int, ramp) -> StreamResult:
    """One whole stream of codes `c` through `run`: stateful from `state` (built once, outside the
    timed call), or windowed."""
    if variant == "stateful":
        return stream_stateful(run, state, c, hop, ramp)
    return stream_windowed(run, c, hop, context, ramp)


@pytest.mark.parametrize("variant", VARIANTS)
def at_chunk(module, chunk: int, seed: int = 0) -> tuple:
    """A call's inputs at `chunk` frames: seeded codes, a full history (windowed) or the start state."""
    return example_inputs(module, codes(module.decoder, module.context + chunk, seed))


@pytest.mark.parametrize("variant", VARIANTS)
def test_call_latency(benchmark, programs, flow_name, variant, chunk, decoder, bench_extra):
    """Latency of one call of the variant's program at one chunk size."""
    results, _ = programs.get(flow_name, variant)
    r = results[method_name(variant)]
    run = programs.runner(flow_name, variant).run
    inputs = at_chunk(r.module, chunk)
    benchmark.group = f"{variant}-chunk{chunk}"
    benchmark.extra_info.update({"flow": flow_name, "variant": variant, "chunk": chunk, "kind": "call"})
    benchmark.pedantic(run, args=(r.spec.method, inputs), rounds=5, iterations=1, warmup_rounds=1)
    if flow_name != "eager" and not any(p["flow"] == flow_name and p["method"] == r.spec.method for p in bench_extra["programs"]):
        bench_extra["programs"].append({"flow": flow_name, "variant": variant, "chunk": f"1..{r.spec.max_chunk}",
                                        "method": r.spec.method,
                                        "bytes": r.bytes, "nodes": r.nodes, "delegation": r.delegation,
                                        "plan_bytes": r.plan_bytes,
                                        **{f"{k}_s": v for k, v in r.seconds.items()}})


@pytest.mark.parametrize("variant", VARIANTS)
def test_op_profile(programs, flow_name, variant, ramp, bench_extra):
    """Where each ExecuTorch method's time goes, from the runtime's ETDump trace (per op, inside
    and outside the delegate). Not a pytest-benchmark timing: ETDump's event timer is the clock."""
    from c2w_export.report.profile import profile_pte, shares

    if not flow_name.startswith("executorch"):
        pytest.skip("ETDump profiles ExecuTorch programs only")
    results, _ = programs.get(flow_name, variant)
    r = results[method_name(variant)]
    for chunk in ramp:
        rows = profile_pte(r.path, r.spec.method, list(at_chunk(r.module, chunk)), flow_name.removeprefix("executorch_"))
        bench_extra["profiles"].append({"flow": flow_name, "variant": variant, "chunk": chunk, **shares(rows)})


@pytest.mark.parametrize("variant", VARIANTS)
def test_stream_rtf(benchmark, programs, flow_name, variant, ramp, context, decoder, bench_extra):
    """A 20 s stream under the ramp schedule: real-time factor and first-audio latency."""
    cfg = decoder.config
    frames = STREAM_SECONDS * cfg.output_sample_rate // cfg.hop
    c = codes(decoder, frames, 0)
    run = programs.runner(flow_name, variant).run
    init = initial_state(decoder)
    go = lambda: stream_of(run, variant, init, c, cfg.hop, context, ramp)
    benchmark.group = f"stream-{variant}"
    benchmark.extra_info.update({"flow": flow_name, "variant": variant, "kind": "stream"})
    res = benchmark.pedantic(go, rounds=2, iterations=1, warmup_rounds=0)
    rtf = res.real_time_factor(cfg.output_sample_rate)
    benchmark.extra_info.update({"rtf": rtf, "first_audio_s": res.first_chunk_seconds})
    bench_extra["streams"].append({"flow": flow_name, "variant": variant, "frames": frames, "rtf": rtf,
                                   "first_audio_s": res.first_chunk_seconds, "chunks": len(res.steps),
                                   "playback": res.playback(cfg.hop, cfg.output_sample_rate).to_json()})


@pytest.mark.parametrize("variant", VARIANTS)
def test_schedule_study(benchmark, programs, flow_name, variant, ramp, context, decoder, bench_extra):
    """First audio, RTF and playback of a 20 s stream for each candidate schedule whose chunk sizes
    were exported (the session --ramp), plus the session ramp itself; the best of 2 streams each."""
    cfg = decoder.config
    frames = STREAM_SECONDS * cfg.output_sample_rate // cfg.hop
    c = codes(decoder, frames, 5)
    run = programs.runner(flow_name, variant).run
    init = initial_state(decoder)  # states are never mutated in place, so one serves every stream
    candidates = [list(r) for r in SCHEDULES if max(r) <= max(ramp)]  # any schedule within the program's range
    candidates += [ramp] if ramp not in candidates else []

    def study():
        rows = []
        for sched in candidates:
            streams = (stream_of(run, variant, init, c, cfg.hop, context, sched) for _ in range(2))
            best = min(streams, key=lambda r: sum(r.seconds))
            rows.append({"flow": flow_name, "variant": variant, "ramp": sched, "frames": frames,
                         "rtf": best.real_time_factor(cfg.output_sample_rate), "first_audio_s": best.first_chunk_seconds,
                         "playback": best.playback(cfg.hop, cfg.output_sample_rate).to_json()})
        return rows

    benchmark.group = f"schedules-{variant}"
    benchmark.extra_info.update({"flow": flow_name, "variant": variant, "kind": "schedules"})
    bench_extra["schedules"] += benchmark.pedantic(study, rounds=1, iterations=1)


STATIC_CHUNKS = (1, 2, 25)


def test_static_vs_dynamic(programs, decoder, ramp, pytestconfig, bench_extra):
    """The shipped dynamic XNNPACK stateful program against a static program exported for one chunk
    (what every method was before), called alternately, 30 calls each, at chunks 1, 2 and 25: is a
    static method ever worth keeping (the issue's bar: >= 10% faster)?"""
    import time

    from c2w_export.program.flows import ExecuTorchLoaded
    from c2w_export.program.lowering import lower_together
    from c2w_export.program.prepare import prepare

    if "executorch_xnnpack" not in pytestconfig.getoption("--backends").split(","):
        pytest.skip("executorch_xnnpack not in --backends")
    results, _ = programs.get("executorch_xnnpack", "stateful")
    r = results[method_name("stateful")]
    dynamic = programs.runner("executorch_xnnpack", "stateful").run
    prepared = prepare(decoder)
    for chunk in (c for c in STATIC_CHUNKS if c <= r.spec.max_chunk):
        module = make_variant(prepared, "stateful", chunk, 0)
        inputs = list(at_chunk(r.module, chunk))
        t0 = time.perf_counter()
        with torch.no_grad():
            ep = torch.export.export(module, tuple(inputs), strict=False)  # static: this chunk only
        static = ExecuTorchLoaded(lower_together({"stateful": ep}, "xnnpack").to_executorch().buffer)
        lower_s = time.perf_counter() - t0
        times = {"dynamic": [], "static": []}
        for i in range(31):
            for name, call in (("dynamic", lambda: dynamic("stateful", inputs)), ("static", lambda: static.run("stateful", inputs))):
                t = time.perf_counter()
                out = call()
                if i:  # the first of each: a warm-up call
                    times[name].append(time.perf_counter() - t)
        between = compare(dynamic("stateful", inputs)[0], static.run("stateful", inputs)[0]).max_abs
        med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        bench_extra["static_vs_dynamic"].append({"variant": "stateful", "chunk": chunk, "dynamic_ms": med["dynamic"],
                                                 "static_ms": med["static"], "max_abs_between": between,
                                                 "static_lower_s": lower_s})
        print(f"stateful chunk {chunk}: dynamic {med['dynamic']:.2f} ms, static {med['static']:.2f} ms, "
              f"max abs between {between:.3g}, static lowering {lower_s:.1f}s")
        del out


@pytest.mark.parametrize("variant", VARIANTS)
def test_flops(benchmark, decoder, variant, chunk, context, bench_extra):
    """FLOPs per second of audio (FlopCounterMode); the benchmarked call is the eager call, so
    achieved GFLOP/s = FLOPs / latency."""
    module = make_variant(decoder, variant, chunk, context)
    fps = flops_per_audio_second(module)
    if bench_extra["offline_gflop_per_audio_s"] is None:
        bench_extra["offline_gflop_per_audio_s"] = offline_flops_per_audio_second(decoder) / 1e9
    inputs = example_inputs(module)
    benchmark.group = f"flops-{variant}"
    benchmark.extra_info.update({"flow": "eager", "variant": variant, "chunk": chunk, "kind": "flops"})
    with torch.no_grad():
        benchmark.pedantic(module, args=inputs, rounds=3, iterations=1, warmup_rounds=1)
    call_flops = fps * chunk * decoder.config.hop / decoder.config.output_sample_rate
    bench_extra["flops"].append({"variant": variant, "chunk": chunk, "gflop_per_audio_s": fps / 1e9,
                                 "gflop_per_call": call_flops / 1e9,
                                 "achieved_gflop_s": call_flops / 1e9 / benchmark.stats.stats.median})


@pytest.mark.parametrize("variant", VARIANTS)
def test_peak_rss(benchmark, programs, flow_name, variant, ramp, tmp_path, bench_extra):
    """Memory of loading each artifact and of running it, in a fresh process (report/memory.py); the
    artifact's file size (nearly all weights) puts it in scale."""
    if flow_name == "eager":
        pytest.skip("eager has no artifact to load")
    results, _ = programs.get(flow_name, variant)
    r = results[method_name(variant)]
    torch.save(list(example_inputs(r.module)), tmp_path / "inputs.pt")
    args = [sys.executable, "-m", "c2w_export.report.memory", flow_name, str(r.path), r.spec.method, str(tmp_path / "inputs.pt")]
    benchmark.group = "rss"
    benchmark.extra_info.update({"flow": flow_name, "variant": variant, "kind": "rss"})
    out = benchmark.pedantic(lambda: subprocess.run(args, capture_output=True, text=True, check=True), rounds=1, iterations=1)
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    bench_extra["rss"].append({"flow": flow_name, "variant": variant, "chunk": ramp[-1],
                               "file_bytes": r.path.stat().st_size, **rss})


@pytest.mark.parametrize("runtime", ["torch", "xnnpack"])
def test_gemm_peak(runtime, bench_extra):
    """The machine's fp32 GEMM peak in this run, through eager's kernels and XNNPACK's: the report
    puts every achieved GFLOP/s beside it."""
    from c2w_export.report.peak import gemm_peak

    bench_extra["peaks"].append(gemm_peak(runtime))


def test_context_study(benchmark, decoder, ramp, bench_extra):
    """Windowed stream vs offline for left context in {0, 8, 25, 48, 72, 144}: the start (the
    first `context` frames, windows short of history) and the steady state (after 144 frames)."""
    cfg = decoder.config
    frames = 2 * max(CONTEXTS) + 30
    c = codes(decoder, frames, 1)
    with torch.no_grad():
        offline = decoder(c)[:, 0]

    def study():
        rows = []
        for ctx in CONTEXTS:
            run = ModuleLoaded({method_name("windowed"): make_variant(decoder, "windowed", max(ramp), ctx)}).run
            wav = stream_windowed(run, c, cfg.hop, ctx, ramp).wav
            start = max(CONTEXTS) * cfg.hop  # steady state: past every context's warm-up
            d_all, d_steady = compare(wav, offline), compare(wav[:, start:], offline[:, start:])
            d_start = compare(wav[:, :ctx * cfg.hop], offline[:, :ctx * cfg.hop]) if ctx else None
            rows.append({"context": ctx, "snr_db": d_all.snr_db, "max_abs": d_all.max_abs,
                         "start_snr_db": d_start.snr_db if d_start else None,
                         "start_max_abs": d_start.max_abs if d_start else None,
                         "steady_snr_db": d_steady.snr_db, "steady_max_abs": d_steady.max_abs})
        return rows

    benchmark.group = "context-study"
    with torch.no_grad():
        rows = benchmark.pedantic(study, rounds=1, iterations=1)
    bench_extra["context_study"] = [{k: (None if isinstance(v, float) and v == float("inf") else v) for k, v in r.items()} for r in rows]
