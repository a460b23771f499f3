"""Turn a pytest-benchmark run plus our sidecar fields into reports/bench.json, bench.md, PNG
plots and index.md. Usage: python -m c2w_export.report.bench --raw RAW.json --out reports/"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

from ..env import cpu_name, fp16_arithmetic, int8_instructions, versions


def _fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def _calls(raw: dict) -> list[dict]:
    rows = []
    for b in raw.get("benchmarks", []):
        e, s = b.get("extra_info", {}), b["stats"]
        rows.append({**e, "name": b["name"], "group": b.get("group"), "median_s": s["median"], "iqr_s": s["iqr"],
                     "min_s": s["min"], "rounds": s["rounds"]})
    return rows


# the dynamic-chunk programs' goals (issue 30) this bench measures: (what, goal, the config it is set for)
GOALS = {
    "methods": ("methods per (variant, precision)", "1, any chunk 1..25", None),
    "lower": ("lowering one XNNPACK variant", "<= 40 s", "tiny"),
    "delegation": ("partitions / ops outside per XNNPACK method", "<= 3 / <= 30", None),
    "plan": ("the method's memory plan (non-constant buffers)", "<= 20 MB", "real"),
    "static": ("dynamic / static call, chunks 1, 2, 25", "within 5% (0.95-1.05)", "real"),
    "memory": ("load peak / running peak vs the file", "<= 1.4x / <= 1.35x", "real"),
    "cold": ("first chunk after load / warm call", "<= 1.2x", "real"),
}


def _goals(extra: dict) -> list[str]:
    """The goal table of the dynamic-chunk programs, from this run's fields: one row per goal and
    XNNPACK variant, with whether it is met ("-" where this run did not measure it)."""
    progs = {p["variant"]: p for p in extra.get("programs", []) if p["flow"] == "executorch_xnnpack"}
    rss = {r["variant"]: r for r in extra.get("rss", []) if r["flow"] == "executorch_xnnpack"}
    static = {}
    for r in extra.get("static_vs_dynamic", []):
        static.setdefault(r["variant"], []).append(r["dynamic_ms"] / r["static_ms"])
    rows = []
    for v in sorted(set(progs) | set(rss) | set(static)):
        p, m = progs.get(v, {}), rss.get(v)
        d = p.get("delegation") or {}
        x = (lambda kb: (kb - m["base_kb"]) * 1024 / m["file_bytes"]) if m else None
        measured = {
            "methods": (f"1 ({p['method']}, chunks {p['chunk']})", True) if p else None,
            "lower": (f"{p['lower_s']:.1f} s", p["lower_s"] <= 40) if "lower_s" in p else None,
            "delegation": (f"{d['partitions']} / {d['outside_ops']}", d["partitions"] <= 3 and d["outside_ops"] <= 30) if d else None,
            "plan": (f"{p['plan_bytes'] / 1e6:.1f} MB", p["plan_bytes"] <= 20e6) if p.get("plan_bytes") else None,
            "static": (", ".join(f"{r:.2f}" for r in static[v]), all(0.95 <= r <= 1.05 for r in static[v])) if v in static else None,
            "memory": (f"{x(m['load_peak_kb']):.2f}x / {x(m['run_peak_kb']):.2f}x",
                       x(m["load_peak_kb"]) <= 1.4 and x(m["run_peak_kb"]) <= 1.35) if m else None,
            "cold": (f"{m['first_call_s'] / m['warm_call_s']:.2f}x", m["first_call_s"] / m["warm_call_s"] <= 1.2)
            if m and "warm_call_s" in m else None,
        }
        for key, (what, goal, config) in GOALS.items():
            if config not in (None, extra.get("config")):
                continue
            got = measured[key]
            rows.append(f"| {what} | {v} | {goal} | {got[0] if got else '-'} | "
                        f"{('yes' if got[1] else 'no') if got else 'not measured in this run'} |")
    if not rows:
        return []
    return ["", "## Goals of the dynamic-chunk programs (XNNPACK)", "",
            "From this run's rows above and below. Memory: the fresh-process measurement of each program at its "
            "largest chunk; first chunk: the first call after the warm-up call that load makes.", "",
            "| goal | variant | target | measured | met |", "|---|---|---|---|---|", *rows]


def build_report(raw: dict, extra: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    calls = _calls(raw)
    v = versions()
    machine = raw.get("machine_info", {})
    (out / "bench.json").write_text(json.dumps({"pytest_benchmark": raw, "c2w_export": extra}, indent=2))
    hop_s = 1920 / 24000
    lines = [f"# Benchmarks ({extra.get('config')} config)", "",
             f"Machine: {machine.get('cpu', {}).get('brand_raw', cpu_name())}, "
             f"{machine.get('cpu', {}).get('count', '?')} cores, {platform.system()} {platform.release()} (fp16 "
             f"arithmetic: {fp16_arithmetic()}; int8 dot-product instructions: {int8_instructions()}). "
             f"torch {v['torch']}, executorch {v['executorch']}, c2w_export {v['c2w_export']}, Python {v['python']}. "
             f"Ramp {extra.get('ramp')}, context {extra.get('context')}.", "",
             "Absolute times drift on a shared 2-core machine; compare the ratios within this run.", ""]
    peaks = {p["runtime"]: p for p in extra.get("peaks", [])}
    peak = max((p["gflop_s"] for p in peaks.values()), default=None)
    lines += ["## fp32 GEMM peak (this run)", "",
              "One [n, n] @ [n, n] fp32 matmul at n = 512, 1024 and 2048, the fastest of 5 calls at each; the peak is "
              "the best size (report/peak.py). \"% peak\" below is a share of the faster of the two runtimes.", "",
              "| runtime | peak GFLOP/s | at n | ms per call | GFLOP/s by n |", "|---|---|---|---|---|"]
    lines += [f"| {r} | {p['gflop_s']:.3g} | {p['n']} | {p['ms']:.2f} | "
              + ", ".join(f"{n}: {g:.3g}" for n, g in sorted(p["by_size"].items(), key=lambda kv: int(kv[0]))) + " |"
              for r, p in sorted(peaks.items())] or ["| - | - | - | - | - |"]
    share = lambda g: "-" if g is None or not peak else f"{100 * g / peak:.0f}%"
    lines += ["", "## Latency per call", "",
              "GFLOP/s: the eager call's FLOPs (FlopCounterMode) over this flow's median latency.", "",
              "| flow | variant | chunk | median ms | IQR ms | RTF per call | GFLOP/s | % peak | bytes | export s | lower s "
              "| graph nodes | partitions | ops outside the delegate | memory plan MB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    flops = {(f["variant"], f["chunk"]): f for f in extra.get("flops", [])}
    progs = {(p["flow"], p["variant"]): p for p in extra.get("programs", [])}  # one program per variant, every chunk
    for c in sorted((c for c in calls if c.get("kind") == "call"), key=lambda c: (c["flow"], c["variant"], c["chunk"])):
        f = flops.get((c["variant"], c["chunk"]))
        p = progs.get((c["flow"], c["variant"]), {})
        gflops = f["gflop_per_call"] / c["median_s"] if f else None
        lines.append(f"| {c['flow']} | {c['variant']} | {c['chunk']} | {c['median_s'] * 1e3:.2f} | {c['iqr_s'] * 1e3:.2f} | "
                     f"{c['median_s'] / (c['chunk'] * hop_s):.3f} | {_fmt(gflops)} | {share(gflops)} | {p.get('bytes', '-')} | "
                     f"{_fmt(p.get('export_s'), '.1f')} | {_fmt(p.get('lower_s'), '.1f')} | {p.get('nodes') or '-'} | "
                     f"{(p.get('delegation') or {}).get('partitions', '-')} | "
                     f"{(p.get('delegation') or {}).get('outside_ops', '-')} | "
                     f"{_fmt(p['plan_bytes'] / 1e6, '.2f') if p.get('plan_bytes') else '-'} |")
    static = extra.get("static_vs_dynamic", [])
    if static:
        lines += ["", "## One dynamic program against a static program per chunk", "",
                  "The shipped XNNPACK program (one method, chunks 1..max, memory planned at the max) and a program "
                  "exported for that chunk alone (the design before dynamic methods), called alternately in this run: "
                  "median ms of each. \"max abs between\": the two programs' outputs on the same inputs.", "",
                  "| variant | chunk | dynamic ms | static ms | dynamic / static | max abs between | static lowering s |",
                  "|---|---|---|---|---|---|---|"]
        for r in sorted(static, key=lambda r: (r["variant"], r["chunk"])):
            lines.append(f"| {r['variant']} | {r['chunk']} | {r['dynamic_ms']:.2f} | {r['static_ms']:.2f} | "
                         f"{r['dynamic_ms'] / r['static_ms']:.2f} | {r['max_abs_between']:.3g} | {r['static_lower_s']:.1f} |")
    lines += _goals(extra)
    lines += ["", "## Streams (20 s of audio, ramp schedule)", "",
              "Playback: a player that starts with the first chunk and plays 24 kHz in real time, the calls "
              "running back to back (program/playback.py): underruns, total stall, and the start-up buffer "
              "that would avoid every underrun.", "",
              "| flow | variant | RTF (compute/audio) | first audio ms | chunks | underruns | stall ms | start-up buffer ms |",
              "|---|---|---|---|---|---|---|---|"]
    streams = extra.get("streams", [])
    for s in sorted(streams, key=lambda s: (s["flow"], s["variant"])):
        pb = s.get("playback") or {}
        lines.append(f"| {s['flow']} | {s['variant']} | {s['rtf']:.4f} | {s['first_audio_s'] * 1e3:.1f} | {s['chunks']} | "
                     f"{pb.get('underruns', '-')} | {_fmt(pb.get('stall_ms'), '.1f')} | {_fmt(pb.get('startup_buffer_ms'), '.1f')} |")
    schedules = extra.get("schedules", [])
    if schedules:
        lines += ["", "## First-audio schedules (20 s stream, best of 2)", "",
                  "| flow | variant | ramp | first audio ms | RTF | underruns | stall ms | start-up buffer ms |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sorted(schedules, key=lambda r: (r["flow"], r["variant"], r["ramp"])):
            pb = r["playback"]
            lines.append(f"| {r['flow']} | {r['variant']} | {' '.join(map(str, r['ramp']))} | {r['first_audio_s'] * 1e3:.1f} | "
                         f"{r['rtf']:.4f} | {pb['underruns']} | {pb['stall_ms']:.1f} | {pb['startup_buffer_ms']:.1f} |")
    by = {(s["flow"], s["variant"]): s["rtf"] for s in streams}
    ratios = []
    for flow in sorted({s["flow"] for s in streams}):
        if (flow, "windowed") in by and (flow, "stateful") in by:
            ratios.append(f"- {flow}: windowed / stateful RTF = {by[(flow, 'windowed')] / by[(flow, 'stateful')]:.2f}x")
    for variant in ("windowed", "stateful"):
        if ("eager", variant) in by:
            for flow in sorted({s["flow"] for s in streams} - {"eager"}):
                if (flow, variant) in by:
                    ratios.append(f"- {variant}: eager / {flow} RTF = {by[('eager', variant)] / by[(flow, variant)]:.2f}x (>1: {flow} faster)")
    lines += ["", "Ratios within this run:", "", *ratios]
    lines += ["", "## FLOPs per second of audio (FlopCounterMode)", "",
              f"Offline decode: {_fmt(extra.get('offline_gflop_per_audio_s'))} GFLOP per second of audio.", "",
              "| variant | chunk | GFLOP / audio s | x offline | achieved GFLOP/s (eager) | % peak |", "|---|---|---|---|---|---|"]
    off = extra.get("offline_gflop_per_audio_s") or math.nan
    for f in sorted(extra.get("flops", []), key=lambda f: (f["variant"], f["chunk"])):
        lines.append(f"| {f['variant']} | {f['chunk']} | {f['gflop_per_audio_s']:.3g} | {f['gflop_per_audio_s'] / off:.2f} | "
                     f"{f['achieved_gflop_s']:.3g} | {share(f['achieved_gflop_s'])} |")
    lines += ["", "## Memory and cold start (fresh process per artifact, report/memory.py)", "",
              "Base: RSS with torch and the flow's runtime imported. Load: opening the file and loading the method "
              "(cold start; XNNPACK packs the weights); its peak is the kernel's VmHWM. After load: what stays, "
              "anonymous (private: packed weights, buffers) + file-backed (mapped files: the libraries, the artifact). Running: "
              "VmHWM over 5 calls, reset after loading. \"x file\": (peak - base) / the artifact's size (nearly all "
              "weights). Warm-up: the first call after loading, which `decode` and `open_stream` make before a stream "
              "(Dispatch.preload). First call: the next one, the stream's first chunk. Warm: the median of the 3 after it. "
              "All calls at the same chunk.", "",
              "| flow | variant | chunk | file MiB | base RSS MiB | load peak MiB | x file | after load MiB (anon + file) "
              "| running peak MiB | x file | load ms | warm-up ms | first call ms | warm ms | first / warm |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(extra.get("rss", []), key=lambda r: (r["flow"], r["variant"])):
        mb = lambda kb: f"{kb / 1024:.0f}"
        scale = lambda kb: f"{(kb - r['base_kb']) * 1024 / r['file_bytes']:.2f}"
        lines.append(f"| {r['flow']} | {r['variant']} | {r['chunk']} | {r['file_bytes'] / 2**20:.1f} | {mb(r['base_kb'])} | "
                     f"{mb(r['load_peak_kb'])} | {scale(r['load_peak_kb'])} | {mb(r['load_kb'])} ({mb(r['load_anon_kb'])} + "
                     f"{mb(r['load_file_kb'])}) | {mb(r['run_peak_kb'])} | {scale(r['run_peak_kb'])} | "
                     f"{r['load_s'] * 1e3:.1f} | " + (
                         f"{r['warm_up_s'] * 1e3:.1f} | {r['first_call_s'] * 1e3:.1f} | {r['warm_call_s'] * 1e3:.1f} | "
                         f"{r['first_call_s'] / r['warm_call_s']:.2f} |" if "warm_up_s" in r else
                         f"- | {r['first_call_s'] * 1e3:.1f} | - | - |"))
    lines += ["", "## Where the time goes (ETDump, per method call)", "",
              "From the runtime's own trace (`c2w-export profile` prints the full table for shipped artifacts): the "
              "method's total, the time inside the delegate and in portable kernels outside it (op calls in "
              "brackets), and the slowest ops. One warm-up call is left out.", "",
              "| flow | variant | chunk | total ms | in delegate ms | portable ms | slowest ops (ms) |",
              "|---|---|---|---|---|---|---|"]
    for r in sorted(extra.get("profiles", []), key=lambda r: (r["flow"], r["variant"], r["chunk"])):
        where = {w: f"{ms:.3g} ({r['calls_by_where'][w]})" for w, ms in r["ms_by_where"].items()}
        inside = next((v for w, v in where.items() if w != "portable"), "-")
        slowest = "; ".join(f"{o['where']} {o['op']} x{o['calls']} {o['ms']:.3g}" for o in r["slowest"])
        lines.append(f"| {r['flow']} | {r['variant']} | {r['chunk']} | {r['total_ms']:.3g} | {inside} | "
                     f"{where.get('portable', '-')} | {slowest} |")
    lines += ["", "## Windowed context study (eager windowed stream vs offline)", "",
              "Start: the first `context` frames, decoded by windows short of history (their pad marked absent: "
              "exact by construction). Steady: after the first 144 frames (every context's full windows).", "",
              "| left context | start SNR dB | start max abs | steady SNR dB | steady max abs | whole SNR dB |",
              "|---|---|---|---|---|---|"]
    snr = lambda x: "inf" if x is None else f"{x:.1f}"
    for r in extra.get("context_study", []):
        start = "-" if not r["context"] else snr(r.get("start_snr_db"))
        lines.append(f"| {r['context']} | {start} | {_fmt(r.get('start_max_abs'))} | {snr(r['steady_snr_db'])} | "
                     f"{r['steady_max_abs']:.3g} | {snr(r['snr_db'])} |")
    lines += ["", "Plots: [latency by chunk](latency_by_chunk.png), [RTF](rtf.png), [context study](context_snr.png), "
              "[playback by schedule](playback.png)."]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    _plots(calls, extra, out)
    _index(out, extra, v)


def _plots(calls, extra, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    series: dict = {}
    for c in calls:
        if c.get("kind") == "call":
            series.setdefault((c["flow"], c["variant"]), []).append((c["chunk"], c["median_s"] * 1e3))
    for (flow, variant), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ls="-" if variant == "stateful" else "--",
                label=f"{flow} {variant}")
    ax.set(xlabel="chunk (frames)", ylabel="median latency per call (ms)", title="Latency by chunk size", yscale="log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency_by_chunk.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    streams = sorted(extra.get("streams", []), key=lambda s: (s["flow"], s["variant"]))
    ax.bar([f"{s['flow']}\n{s['variant']}" for s in streams], [s["rtf"] for s in streams],
           color=["tab:blue" if s["variant"] == "stateful" else "tab:orange" for s in streams])
    ax.set(ylabel="RTF (compute / audio)", title="Real-time factor, 20 s stream")
    ax.tick_params(axis="x", labelsize=6)
    fig.tight_layout()
    fig.savefig(out / "rtf.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    study = extra.get("context_study", [])
    cap = 150.0  # identical streams have infinite SNR; drawn at the cap
    ax.plot([r["context"] for r in study], [r["snr_db"] if r["snr_db"] is not None else cap for r in study], marker="o", label="whole stream")
    ax.plot([r["context"] for r in study], [r["steady_snr_db"] if r["steady_snr_db"] is not None else cap for r in study],
            marker="s", label="steady state")
    ax.plot([r["context"] for r in study if r["context"]],
            [r.get("start_snr_db") or cap for r in study if r["context"]], marker="^", label="start (first context frames)")
    ax.set(xlabel="left context (frames)", ylabel="SNR vs offline (dB)", title="Windowed streaming: SNR against left context")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "context_snr.png", dpi=100)
    plt.close(fig)

    schedules = sorted(extra.get("schedules", []), key=lambda r: (r["flow"], r["variant"], r["ramp"]))
    if schedules:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{r['flow']}\n{r['variant']}\n{' '.join(map(str, r['ramp']))}" for r in schedules]
        x = range(len(schedules))
        ax.bar([i - 0.2 for i in x], [r["first_audio_s"] * 1e3 for r in schedules], width=0.4, label="first audio ms")
        ax.bar([i + 0.2 for i in x], [r["playback"]["startup_buffer_ms"] for r in schedules], width=0.4,
               label="start-up buffer for no underrun, ms")
        ax.set_xticks(list(x), labels, fontsize=5)
        ax.set(ylabel="ms", title="First audio and playback margin by schedule", yscale="symlog")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "playback.png", dpi=100)
        plt.close(fig)


def _index(out: Path, extra: dict, v: dict) -> None:
    links = [("parity.md", "parity summary (tox -e parity)"), ("numerics.md", "numerics per flow and chunk (tox -e parity)"),
             ("bench.md", "benchmarks (tox -e bench)"), ("bench.json", "raw pytest-benchmark JSON plus our fields"),
             ("latency_by_chunk.png", "plot: latency by chunk"), ("rtf.png", "plot: RTF per flow and variant"),
             ("context_snr.png", "plot: windowed SNR against left context"),
             ("playback.png", "plot: first audio and start-up buffer by schedule"),
             ("real/bench.md", "real-size benchmarks (tox -e bench-real)"), ("numerics-real.md", "real-size numerics (tox -e real)")]
    lines = ["# Reports", "",
             f"Last bench run: config {extra.get('config')}, ramp {extra.get('ramp')}, context {extra.get('context')}; "
             f"torch {v['torch']}, executorch {v['executorch']}, c2w_export {v['c2w_export']}, Python {v['python']}.", ""]
    lines += [f"- [{name}]({name}): {what}" + ("" if (out / name).exists() else " (not generated yet)") for name, what in links]
    (out / "index.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m c2w_export.report.bench")
    p.add_argument("--raw", type=Path, required=True)
    p.add_argument("--extra", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("reports"))
    a = p.parse_args(argv)
    raw = json.loads(a.raw.read_text())
    extra = json.loads((a.extra or a.out / "bench-extra.json").read_text())
    marker = a.out / ".bench-session"
    if a.extra is None and marker.is_file() and marker.read_text().strip() != extra.get("session"):
        print(f"{a.out}/bench.md not rewritten: the last benchmark run was partial (its fields are not in bench-extra.json)")
        return 0
    build_report(raw, extra, a.out)
    print(f"wrote {a.out}/bench.md, bench.json, PNG plots and index.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
