"""The shipped XNNPACK programs on the phone's instruction set: ExecuTorch's aarch64 runtime under QEMU
user mode (c2w_export/arm64), judged against the same references and tolerance table as on x86.

Every XNNPACK precision that ships, both variants, on two CPU models (runtime.CPUS): cortex-a76, with
FEAT_FP16 (XNNPACK's fp16 kernels accumulate in fp16, as on a current phone), and cortex-a72, without
(they accumulate in float32). Per program: windows at drawn chunk sizes and histories, and one
irregular stream whose state the ARM program carries itself. Each call's audio is held to:

1. the program's own reference (fp32: the fp32 eager decoder; reduced: its own eager reference) at the
   precision's XNNPACK gate for that CPU model's fp16 arithmetic (not the host's);
2. a reduced precision's quality floor against the fp32 eager decoder;

and its distance from the same program run on this x86 host is recorded (reports/arm64.md from a
complete run, with the time of the calls as a ratio to the host's and, for fp16, what the native-fp16
emulation predicted); fp32 is gated there too. The committed golden audio is streamed through the fp32
stateful program on ARM. All of one CPU model's calls run in one aarch64 process (~40 s of imports
under emulation), run once per session per CPU model (`arm_run`).

Runs with `--arm64 DIR` (tox -e arm64 prepares DIR and passes it); without it every test here is
skipped, saying so. A runtime that --arm64 names but that is not ready fails, never skips.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import pytest
import torch

from c2w_export.arm64.qemu import Job, run
from c2w_export.arm64.runtime import CPUS, Unavailable, ready
from c2w_export.program.compare import combine, compare
from c2w_export.program.native_fp16 import emulated
from c2w_export.program.pipeline import QUALITY
from c2w_export.program.precision import PRECISIONS
from c2w_export.program.streaming import schedule
from c2w_export.program.tolerances import EMULATION_AGREEMENT_DB, tolerance
from c2w_export.program.variants import VARIANTS, make_variant, parity_inputs
from c2w_export.report.golden import check_wav, load_golden
from helpers import ProgramCache, cases

FLOW = "executorch_xnnpack"
SHIPPED = ("fp32", "fp16", "fp16-mixed", "int8-tail", "int8-dynamic")  # what `export --precision` ships for XNNPACK
PROGRAMS = [(p, v) for p in SHIPPED for v in VARIANTS]
ARM_CASES = [(f"{cpu}-{p}-{v}", cpu, p, v) for cpu in CPUS for p, v in PROGRAMS]
SEED = 41  # the drawn chunks and histories; printed with every failure
WINDOW_CALLS, STREAM_CALLS = 4, 6
# a program that differs only on ARM: the ARM process runs the fp32 stateful .pte with one weight doubled
# (the x86 side runs the program as built), so only ARM's own comparison can see it
ARM_ONLY_BUG = "fp32-stateful-weight-x2-on-arm-only"
BUG_WEIGHT = "decoder.pre_transformer.layers.0.self_attn.o_proj.weight"
GOLDEN = "golden-tiny_seed0-fp32-stateful"
GOLDEN_DIR = Path(__file__).parent / "golden"


def chunks(variant: str, max_chunk: int, rng: random.Random) -> list[int]:
    """The drawn chunk sizes of one program's calls: both ends of the dynamic axis and drawn ones between."""
    n = WINDOW_CALLS if variant == "windowed" else STREAM_CALLS
    return [1, max_chunk] + [rng.randint(2, max_chunk - 1) for _ in range(n - 2)]


def calls_for(module, variant: str, max_chunk: int) -> list[tuple]:
    """The calls of one program: windows (codes, history: partial, full and none in turn) or one
    irregular stream's chunks (codes; the state is carried by whoever runs it), seeded by SEED."""
    rng = random.Random(f"{SEED}-{variant}")
    sizes = chunks(variant, max_chunk, rng)
    if variant == "windowed":
        return [parity_inputs(module, i + 1, SEED, chunk=c)[i] for i, c in enumerate(sizes)]
    return [parity_inputs(module, 1, SEED + i, chunk=c)[0] for i, c in enumerate(sizes)]


def outputs(run_fn, calls: list[tuple], state: tuple) -> list[tuple]:
    """Each call's outputs through `run_fn(*inputs)`, a stream's state fed back (state=(): windowed)."""
    outs = []
    for c in calls:
        with torch.no_grad():
            o = run_fn(*c, *state)
        o = tuple(o) if isinstance(o, (tuple, list)) else (o,)
        state = o[1:] if state else ()
        outs.append(o)
    return outs


def wav_diff(actual: list, reference: list):
    return combine([compare(torch.as_tensor(a[0]), r[0]) for a, r in zip(actual, reference)])


@pytest.fixture(scope="session")
def arm64_root(pytestconfig) -> Path:
    """The prepared aarch64 runtime (--arm64 DIR). Not given: skip, saying how to run these tests.
    Given but not ready: fail (a broken runtime must not pass as a skip). The host cannot have it
    (prepare wrote unavailable.txt: not Debian, no QEMU): skip with that reason."""
    root = pytestconfig.getoption("--arm64")
    if not root:
        pytest.skip("aarch64 tests: pass --arm64 DIR (tox -e arm64 prepares the runtime and does)")
    why = Path(root) / "unavailable.txt"
    if why.exists():
        pytest.skip(f"aarch64 runtime unavailable on this host: {why.read_text().strip()}")
    try:
        ready(root)
    except Unavailable as e:
        pytest.fail(str(e))
    return Path(root)


@dataclasses.dataclass
class Built:
    """One shipped program, its calls and what its ARM outputs are compared with (each: one tuple of
    outputs per call)."""

    result: object  # pipeline.ProgramResult
    calls: list
    state: tuple  # the stream's initial state (stateful), else ()
    x86: list  # the same program on this host
    x86_s: float  # the host's seconds for those calls (after a warm-up call)
    own: list  # its own reference (fp32: the fp32 eager decoder)
    fp32: list  # the fp32 eager decoder
    emulated: list | None  # half precisions: the own reference with native fp16 arithmetic, emulated


@pytest.fixture(scope="session")
def arm_programs(decoder, ramp, context, tmp_path_factory):
    """(precision, variant) -> (ProgramResult, calls, x86 outputs, own-reference outputs, fp32 outputs):
    each shipped program built once per session (lowering-cache hits where the session's other tests or
    --lower-cache hold it), its calls drawn, and the host's and the references' outputs computed."""
    cache = ProgramCache(decoder, max(ramp), context, tmp_path_factory.mktemp("arm64"))
    built = {}

    def get(precision, variant):
        if (precision, variant) not in built:
            results, _ = cache.get(FLOW, variant, precision)
            r = results[variant]
            calls = calls_for(r.module, variant, max(ramp))
            state = r.module.initial_state() if variant == "stateful" else ()
            fp32 = make_variant(decoder, variant, max(ramp), context)
            runner = cache.runner(FLOW, variant, precision)
            runner.run(variant, (*calls[0], *state))  # warm: the first call loads the method (XNNPACK packs weights)
            t = time.perf_counter()
            x86 = outputs(lambda *i: runner.run(variant, i), calls, state)
            x86_s = time.perf_counter() - t
            own_state = r.own.initial_state() if (r.own and state) else state
            half = PRECISIONS[precision].half  # what the native-fp16 emulation predicts a phone computes
            built[(precision, variant)] = Built(
                r, calls, state, x86, x86_s, outputs(r.own or fp32, calls, own_state),
                outputs(fp32, calls, fp32.initial_state() if state else ()),
                outputs(lambda *i: emulated(r.own)(variant, i), calls, own_state) if half else None)
        return built[(precision, variant)]
    return get


def _patched_pte(path: Path, out: Path, ep_weight: torch.Tensor) -> Path:
    from test_precision import _scaled_in_buffer

    out.write_bytes(_scaled_in_buffer(path.read_bytes(), ep_weight, 2.0))
    return out


@pytest.fixture(scope="session")
def arm_run(arm64_root, arm_programs, ramp, tmp_path_factory):
    """cpu -> qemu.Run of every shipped program's calls on that CPU model, plus ARM_ONLY_BUG: one aarch64
    process per CPU model, run once per session (the tests of one model share a worker: conftest.flow_group)."""
    runs = {}

    def get(cpu):
        if cpu not in runs:
            jobs = []
            # the CPU models' workers build the programs in opposite orders, so on a cold lowering cache they
            # lower different programs at once instead of one waiting for the other's lowering
            for p, v in (PROGRAMS if list(CPUS).index(cpu) % 2 == 0 else PROGRAMS[::-1]):
                b = arm_programs(p, v)
                jobs.append(stream_job(f"{p}-{v}", b.result.path, b.calls, b.state) if b.state
                            else Job(f"{p}-{v}", b.result.path, v, b.calls))
            b = arm_programs("fp32", "stateful")
            weight = dict(b.result.module.named_parameters())[BUG_WEIGHT]
            bad = _patched_pte(b.result.path, tmp_path_factory.mktemp("arm-bug") / "bug.pte", weight)
            jobs.append(stream_job(ARM_ONLY_BUG, bad, b.calls, b.state))
            golden = load_golden(GOLDEN_DIR)  # the committed fp32 audio of these codes, streamed in the ramp
            codes = torch.from_numpy(golden["codes"])
            jobs.append(stream_job(GOLDEN, b.result.path, [(codes[..., s.start:s.start + s.frames],)
                                                           for s in schedule(codes.shape[-1], ramp)], b.state))
            runs[cpu] = run(arm64_root, cpu, jobs)
            print(f"arm64 {cpu}: {runs[cpu].report['total_s']:.0f} s in the aarch64 process "
                  f"({runs[cpu].report['import_s']:.0f} s imports)", flush=True)
        return runs[cpu]
    return get


def stream_job(name: str, pte: Path, calls: list[tuple], state: tuple) -> Job:
    """One stream through a stateful .pte: the start state goes in with the first call, after which the
    ARM program carries its own."""
    return Job(name, pte, "stateful", [(*c, *state) if i == 0 else tuple(c) for i, c in enumerate(calls)], stream=True)


@pytest.mark.parametrize("cpu,precision,variant", cases(ARM_CASES))
def test_shipped_program_on_arm(arm_run, arm_programs, numerics_log, cpu, precision, variant):
    """Side 1 at the gate of the CPU model's fp16 arithmetic, side 2 at the quality floor; fp32 also
    within its gate of the x86 run of the same program."""
    b, out = arm_programs(precision, variant), arm_run(cpu).outputs[f"{precision}-{variant}"]
    key = PRECISIONS[precision].key
    sizes = [int(c[0].shape[-1]) for c in b.calls]
    side1, x86, quality = wav_diff(out, b.own), wav_diff(out, b.x86), wav_diff(out, b.fp32)
    gate = tolerance(FLOW, key, CPUS[cpu].arithmetic)
    # what the native-fp16 emulation behind the NATIVE gate predicts a phone's fp16 quality to be
    predicted = wav_diff(b.emulated, b.fp32).snr_db if b.emulated is not None and CPUS[cpu].fp16 else None
    numerics_log.append({"arm64": True, "cpu": cpu, "precision": precision, "variant": variant,
                         "arithmetic": CPUS[cpu].arithmetic, "frames": sizes, "side1": side1.describe(),
                         "side1_snr": side1.snr_db, "quality_snr": quality.snr_db, "x86": x86.describe(),
                         "x86_snr": x86.snr_db, "x86_max": x86.max_abs,
                         "slower": sum(arm_run(cpu).report["jobs"][f"{precision}-{variant}"]) / b.x86_s,
                         "emulated_snr": predicted})
    what = f"{precision} {variant} on {cpu} (calls of {sizes} code frames, SEED {SEED})"
    assert side1.within(gate), f"{what} vs its own reference: {side1.describe()} over {gate}"
    if precision != "fp32":
        floor = tolerance(QUALITY, key, CPUS[cpu].arithmetic)
        assert quality.within(floor), f"{what} vs the fp32 eager decoder: {quality.describe()} under the floor {floor}"
        if predicted is not None:
            assert abs(quality.snr_db - predicted) <= EMULATION_AGREEMENT_DB, (
                f"{what}: {quality.snr_db:.1f} dB against fp32, the native-fp16 emulation predicted {predicted:.1f} dB")
    else:
        assert x86.within(gate), f"{what} vs the same program on x86: {x86.describe()} over {gate}"


@pytest.mark.parametrize("cpu", [pytest.param(c, id=c) for c in CPUS])
def test_arm_only_bug_fails_on_arm(arm_run, arm_programs, cpu):
    """The gate sees what only ARM computes: the ARM process ran a .pte with one attention projection
    doubled, the x86 run did not. ARM's own comparison fails; the x86 program still passes."""
    b = arm_programs("fp32", "stateful")
    gate = tolerance(FLOW, "float32")
    assert wav_diff(b.x86, b.own).within(gate)
    bad = wav_diff(arm_run(cpu).outputs[ARM_ONLY_BUG], b.own)
    assert not bad.within(gate), f"a doubled weight run on {cpu} passed: {bad.describe()}"


@pytest.mark.parametrize("cpu", [pytest.param(c, id=c) for c in CPUS])
def test_golden_set_on_arm(arm_run, arm_programs, decoder, cpu):
    """The committed golden audio (tests/golden/tiny_seed0.npz: the offline fp32 decode of its codes, made
    on x86) from the fp32 stateful program streaming those codes on ARM in the ramp, at the golden gate."""
    golden = load_golden(GOLDEN_DIR)
    wav = torch.cat([torch.as_tensor(o[0]) for o in arm_run(cpu).outputs[GOLDEN]], dim=-1)
    ok, text = check_wav(golden, wav, decoder.config.hop, f"fp32 stateful on {cpu}")
    assert ok, text


@pytest.mark.parametrize("cpu", [pytest.param(c, id=c) for c in CPUS])
def test_cpu_model_is_what_it_claims(arm_run, cpu):
    """The guest is aarch64 and advertises FP16 arithmetic exactly when its model has it (what XNNPACK's
    fp16 kernels key on), and nothing a phone lacks (SVE)."""
    r = arm_run(cpu).report
    assert r["machine"] == "aarch64"
    assert r["hwcaps"]["fphp"] == r["hwcaps"]["asimdhp"] == CPUS[cpu].fp16, r["hwcaps"]
    assert not r["hwcaps"]["sve"]


def test_unknown_cpu_model_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown CPU model 'max'; choose from"):
        run(tmp_path, "max", [])


def test_unprepared_runtime_says_how_to_prepare(tmp_path):
    with pytest.raises(Unavailable, match=r"no aarch64 runtime in .*python -m c2w_export.arm64 prepare"):
        run(tmp_path, "cortex-a76", [])


def test_conformance_plugin_runs_the_checks_on_arm(arm64_root, precision_artifacts, model_dir, pytester):
    """`pytest --c2w-arch aarch64`: the conformance checks of shipped fp16 artifacts with every program call
    on an emulated cortex-a76 (one aarch64 process, call by call), side 1 at native-fp16's gate; each id
    and JUnit test case names the arch. (-k windows: the drawn window checks of both methods, 1 example
    each; a whole stream under emulation costs minutes.)"""
    import xml.etree.ElementTree as ET

    arts, xml = precision_artifacts("fp16"), pytester.path / "conformance.xml"
    r = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--noconftest", "-W", "ignore", "--c2w-artifacts", str(arts),
        "--c2w-model", model_dir, "--c2w-arch", "aarch64",
        "--c2w-arm64-runtime", str(arm64_root), "--c2w-cpu", "cortex-a76", "--c2w-examples", "1", "-k", "windows",
        "--junitxml", str(xml), "-v", timeout=1200)
    out = r.stdout.str()
    assert r.ret == 0, out[-4000:]
    assert "programs run on aarch64-cortex-a76" in out
    cases = ET.parse(xml).getroot().iter("testcase")
    names = [(c.get("name"), {p.get("name"): p.get("value") for p in c.iter("property")}) for c in cases]
    assert len(names) == 4 and all(n.startswith("test_windows[aarch64-cortex-a76::") and p == {"arch": "aarch64-cortex-a76"}
                                   for n, p in names), names


@pytest.mark.parametrize("record,rc", [pytest.param(False, 3, id="exit-3"), pytest.param(True, 0, id="or-record")])
def test_a_host_that_cannot_have_the_runtime_says_why(tmp_path, monkeypatch, capsys, record, rc):
    """prepare on a host that cannot have the runtime (here: not x86_64) prepares nothing and says why in one
    line; with --or-record it exits 0 and leaves the reason where the tests read it (they skip with it)."""
    from c2w_export.arm64 import __main__ as cli, runtime

    monkeypatch.setattr(runtime.platform, "machine", lambda: "riscv64")
    assert cli.main(["prepare", "--root", str(tmp_path), *(["--or-record"] if record else [])]) == rc
    why = "the aarch64 runtime is prepared on an x86_64 host; this one is riscv64"
    assert capsys.readouterr().err == f"arm64: not prepared: {why}\n"
    assert not (tmp_path / "ready.json").exists()
    assert ((tmp_path / "unavailable.txt").read_text() == why + "\n") if record else not (tmp_path / "unavailable.txt").exists()


REAL_WINDOW = 2  # frames of the real-size window's chunk: the emulation's cost grows with it


@pytest.mark.real
def test_real_size_fp16_window_on_a_phone_core_agrees_with_the_emulation(arm64_root, real_model_dir, context,
                                                                          tmp_path_factory, capsys):
    """One real-size window (the windowed fp16 program, a chunk of REAL_WINDOW frames, its history as
    the parity checks draw it) on cortex-a76 (FEAT_FP16): its SNR against the fp32 eager decoder agrees with what the
    native-fp16 emulation predicts, within EMULATION_AGREEMENT_DB. Plain fp16 at real size is refused
    by its quality floor (the emulation predicts it), which is why the emulation must hold there too.
    Opt-in: --real with --arm64 DIR (a real-size fp16 lowering, and the program's load and call under
    QEMU)."""
    from c2w_export import load_decoder

    decoder = load_decoder(real_model_dir)
    cache = ProgramCache(decoder, REAL_WINDOW, context, tmp_path_factory.mktemp("arm64-real"))
    results, _ = cache.get(FLOW, "windowed", "fp16")
    r = results["windowed"]
    calls = parity_inputs(r.module, 1, SEED, REAL_WINDOW)
    fp32 = outputs(make_variant(decoder, "windowed", REAL_WINDOW, context), calls, ())
    t = time.perf_counter()
    predicted = wav_diff(outputs(lambda *i: emulated(r.own)("windowed", i), calls, ()), fp32)
    emulation_s = time.perf_counter() - t
    arm = run(arm64_root, "cortex-a76", [Job("real-fp16-windowed", r.path, "windowed", calls)])
    got = wav_diff(arm.outputs["real-fp16-windowed"], fp32)
    with capsys.disabled():
        print(f"\nreal-size fp16 windowed, chunk {REAL_WINDOW} after {int(calls[0][1])} of {context} frames of history, "
              f"on cortex-a76: "
              f"{got.snr_db:.2f} dB against fp32 ({got.describe()}); the emulation predicted {predicted.snr_db:.2f} dB "
              f"(emulation {emulation_s:.0f} s; aarch64 process {arm.report['total_s']:.0f} s, "
              f"imports {arm.report['import_s']:.0f} s)")
    assert abs(got.snr_db - predicted.snr_db) <= EMULATION_AGREEMENT_DB, (got.describe(), predicted.describe())
