"""Windowed programs of every flow against independent references: one method for every chunk
1..max, run at every ramp chunk and at chunk sizes Hypothesis draws from the whole range. The build
compares artifact flows with the fp32 eager decoder and the eager flow with the fp64 decode; the
contract and drawn windows compare every flow with upstream's decode of the same window.

Ids read `<flow>-chunk<n>`. Programs are exported once per session (ProgramCache)."""

import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from c2w_export.model.validate import InputError
from c2w_export.program.compare import compare
from c2w_export.program.flows import FLOWS, FlowError, ModuleLoaded, Loaded
from c2w_export.program.pipeline import build
from c2w_export.program.runner import Dispatch, Runner
from c2w_export.program.tolerances import PERTURBATION, tolerance
from c2w_export.program.variants import Stateful, Windowed, make_variant, method_name
from helpers import cases, code_windows, codes, initial_state, numerics_row, require_flow


@pytest.fixture(scope="session")
def windowed(programs, flow_name):
    return programs.get(flow_name, "windowed")


def test_stages_within_tolerance(programs, windowed, flow_name, chunk, numerics_log):
    """Every compared stage (export, lower, run) of the program is within the flow's tolerance of
    eager (the build draws chunk sizes: the max, 1 and one between), and so is the loaded program
    at each ramp chunk (the numerics rows)."""
    results, _ = windowed
    r = results[method_name("windowed")]
    assert r.passed, r.failure()
    assert list(r.stages) == FLOWS[flow_name].compared
    d = programs.chunk_diff(flow_name, "windowed", chunk)
    numerics_log.append(numerics_row(flow_name, "windowed", chunk, d, r.stages))
    assert d.within(r.tolerance), f"{flow_name} windowed at chunk {chunk}: {d.describe()}"


def _history(h: int) -> torch.Tensor:
    return torch.tensor([h], dtype=torch.int64)


def test_output_contract(programs, windowed, flow_name, chunk, decoder, context, oracle):
    """Shape [1, chunk*hop], float32, finite, deterministic, within tolerance of upstream's decode
    of a fresh window, with a full history and at a stream start (no history, a partial one)."""
    run = programs.runner(flow_name, "windowed").run
    method = method_name("windowed")
    c = codes(decoder, context + chunk, seed=chunk)
    for h in (context, 0, context // 3):
        out = run(method, (c, _history(h)))
        assert len(out) == 1
        wav = out[0]
        assert wav.shape == (1, chunk * decoder.config.hop) and wav.dtype == torch.float32
        assert torch.isfinite(wav).all()
        assert torch.equal(run(method, (c, _history(h)))[0], wav), "not deterministic"
        d = compare(wav, oracle.window(c, context, h))
        assert d.within(tolerance(flow_name)), f"{flow_name} {method} history {h} vs upstream: {d.describe()}"


@settings(max_examples=25)
@given(data=st.data())
def test_drawn_windows(programs, windowed, flow_name, ramp, decoder, context, oracle, data):
    """Drawn chunk sizes (the whole range 1..max), code patterns and histories through every
    program, against upstream's decode of the same window without its absent frames."""
    cfg = decoder.config
    chunk = data.draw(st.integers(1, max(ramp)), label="chunk")
    c = data.draw(code_windows(cfg.num_quantizers, context + chunk, cfg.codebook_size))
    h = data.draw(st.integers(0, context))
    run = programs.runner(flow_name, "windowed").run
    d = compare(run(method_name("windowed"), (c, _history(h)))[0], oracle.window(c, context, h))
    assert d.within(tolerance(flow_name)), f"chunk {chunk} history {h} vs upstream: {d.describe()}"


# ---------------------------------------------------------------- the gate can fail
PERTURBED = [
    ("o_proj", lambda d: d.pre_transformer.layers[0].self_attn.o_proj.weight),
    ("final-conv", lambda d: d.decoder[-1].conv.weight),
    ("codebook", lambda d: d.quantizer.rvq_rest.vq.layers[3]._codebook.embedding_sum),
]


@pytest.mark.parametrize("pick", cases(PERTURBED))
def test_build_rejects_perturbed_weight(decoder, ramp, context, tmp_path, pick):
    """pipeline.build of a program whose module has one weight tensor changed by 1e-3 (relative),
    checked against the checkpoint's decoder: every compared stage fails the gate."""
    bad = copy.deepcopy(decoder)
    with torch.no_grad():
        pick(bad).mul_(1 + PERTURBATION)
    results, _ = build(bad, FLOWS["torch_export"], ["windowed"], max(ramp), context, tmp_path, reference=decoder)
    r = results[0]
    assert not r.passed, f"perturbation passed the gate: {r.diff.describe()}"
    assert all(not d.within(r.tolerance) for d in r.stages.values()), r.failure()
    assert "torch_export windowed" in r.failure() and "diverged from the float32 eager decoder" in r.failure()


def test_export_refuses_perturbed_program(model_dir, decoder, ramp, context, tmp_path):
    """export_artifacts with a perturbed module of the checkpoint raises ParityError and writes nothing."""
    from c2w_export.program.pipeline import ParityError
    from c2w_export.ship.export import export_artifacts

    bad = copy.deepcopy(decoder)
    with torch.no_grad():
        PERTURBED[0][1](bad).mul_(1 + PERTURBATION)
    with pytest.raises(ParityError, match="not shipped, over tolerance"):
        export_artifacts(model_dir, tmp_path, ramp=ramp, context=context, backend="torch_export",
                         variants=["stateful"], decoder=bad, progress=lambda s: None)
    assert list(tmp_path.iterdir()) == []


def _late_history(right):
    """A window builder whose history is one frame late (its last frame repeated, its first lost)."""
    def late(hist, new, ctx):
        if hist.shape[-1] > 1:
            hist = torch.cat([hist[:, :, :1], hist[:, :, :-1]], -1)
        return right(hist, new, ctx)
    return late


def _history_off_by_one(right):
    """A window builder that claims one frame of history more than it has (while it has fewer than context)."""
    def wrong(hist, new, ctx):
        window, h = right(hist, new, ctx)
        return window, h + 1 if h[0] < ctx else h
    return wrong


WINDOW_BUGS = [  # (id, builder wrapper, the stream check that must fail)
    ("history-one-frame-late", _late_history, "windowed-steady"),
    ("history-count-off-by-one", _history_off_by_one, "windowed-start"),
]


@pytest.mark.parametrize("bug,fails", cases(WINDOW_BUGS))
def test_stream_check_rejects_window_bug(decoder, ramp, context, monkeypatch, bug, fails):
    """The production stream check with a broken window builder: the windowed stream's start and
    steady state are compared with the offline decode, which does not use the builder."""
    import c2w_export.program.streaming as streaming

    run = ModuleLoaded({method_name("windowed"): make_variant(decoder, "windowed", max(ramp), context)}).run
    frames = streaming.stream_frames(ramp, 3, context)
    gate = tolerance("executorch_xnnpack")
    good = streaming.stream_check(decoder, run, ["windowed"], ramp, context, frames, 3, gate)
    assert [s.name for s in good] == ["windowed", "windowed-start", "windowed-steady"]
    assert all(s.passed for s in good), [s.describe() for s in good]
    monkeypatch.setattr(streaming, "windowed_inputs", bug(streaming.windowed_inputs))
    bad = {s.name: s for s in streaming.stream_check(decoder, run, ["windowed"], ramp, context, frames, 3, gate)}
    assert not bad[fails].passed, bad[fails].describe()


# ---------------------------------------------------------------- bad input never reaches the runtime
class Spy(Loaded):
    def __init__(self):
        self.methods, self.calls = ["windowed"], 0

    def run(self, method, inputs):
        self.calls += 1
        return (torch.zeros(1),)


BAD_INPUT = [  # (id, (codes, history) -> bad inputs, message); the program takes chunks 1..25 after 72 frames
    ("int32", lambda c, h: (c.to(torch.int32), h), "must be int64"),
    ("chunk-0", lambda c, h: (c[:, :, :72], h), r"^windowed takes chunks of 1\.\.25 frames after its 72 frames of "
                                                  r"context; codes of T=72 frames are a chunk of 0$"),
    ("chunk-max-plus-1", lambda c, h: (torch.cat([c, c[:, :, :24]], -1), h), "T=98 frames are a chunk of 26"),
    ("wrong-q", lambda c, h: (c[:, 1:], h), "Q=16"),
    ("out-of-range", lambda c, h: (c.index_fill(2, torch.tensor([5]), 2048), h), "found 2048 at index"),
    ("negative", lambda c, h: (c.index_fill(2, torch.tensor([0]), -3), h), "found -3"),
    ("no-history", lambda c, h: (c,), r"^windowed takes 2 inputs \(codes, history\), got 1$"),
    ("history-too-long", lambda c, h: (c, h + 1), "must be 0..72"),
    ("history-negative", lambda c, h: (c, h - 73), "history.*non-negative"),
    ("history-float", lambda c, h: (c, h.float()), "history"),
    ("history-shape", lambda c, h: (c, h.repeat(2)), "history"),
]


@pytest.mark.parametrize("make,message", cases(BAD_INPUT))
def test_runner_rejects_bad_input_before_runtime(decoder, make, message):
    spy = Spy()
    runner = Runner("spy", spy, {"windowed": Windowed(decoder, 25, 72).spec()}, decoder.config.codebook_size)
    c, h = codes(decoder, 74, 0), _history(72)
    for chunk in (1, 2, 25):  # any chunk of the range is accepted
        runner.run("windowed", (codes(decoder, 72 + chunk, 0), h))
    assert spy.calls == 3
    with pytest.raises(InputError, match=message):
        runner.run("windowed", make(c, h))
    assert spy.calls == 3, "bad input reached the runtime"


class _Broken(Spy):
    def __init__(self, out):
        super().__init__()
        self.out = out

    def run(self, method, inputs):
        if isinstance(self.out, Exception):
            raise self.out
        return self.out


RUNNER_ERRORS = [  # (id, what goes wrong, error type, exact message)
    ("unknown-method", lambda d, r: r.run("chunk_9", ()), InputError,
     "unknown method 'chunk_9'; this program has ['windowed']"),
    ("dispatch-unknown", lambda d, r: Dispatch({"windowed": r}).run("chunk_9", ()), FlowError,
     "no program for method 'chunk_9'; have ['windowed']"),
    ("absent-method", lambda d, r: Runner("spy", Spy(), {"stateful": Stateful(d, 25).spec()}, 2048), FlowError,
     "spy: program has no method(s) ['stateful']; it has ['windowed']"),
    ("runtime-raises", lambda d, r: Runner("spy", _Broken(RuntimeError("boom")), r.specs, 2048).run("windowed", _good(d)),
     FlowError, "spy: method windowed failed in its runtime on a chunk of 2 (of 1..25): RuntimeError: boom"),
    ("wrong-output-count", lambda d, r: Runner("spy", _Broken((torch.zeros(1),) * 2), r.specs, 2048).run("windowed", _good(d)),
     FlowError, "spy: method windowed returned 2 outputs, its spec says 1"),
]


def _good(decoder):
    return codes(decoder, 74, 0), _history(72)


@pytest.mark.parametrize("fails,error,message", cases(RUNNER_ERRORS))
def test_runner_errors_name_the_method_and_the_program(decoder, fails, error, message):
    runner = Runner("spy", Spy(), {"windowed": Windowed(decoder, 25, 72).spec()}, decoder.config.codebook_size)
    with pytest.raises(error) as e:
        fails(decoder, runner)
    assert str(e.value) == message


def test_runner_names_the_bad_state_tensor(decoder):
    spec = Stateful(decoder, 25).spec()
    spy = Spy()
    spy.methods = [spec.method]
    runner = Runner("spy", spy, {spec.method: spec}, decoder.config.codebook_size)
    state = list(initial_state(decoder))
    state[1] = state[1].double()
    with pytest.raises(InputError, match=rf"^state '{spec.inputs[2].name}' must be float32, got float64$"):
        runner.check(spec.method, (codes(decoder, 2, 0), *state))


def test_loaded_program_rejects_bad_input(programs, flow_name, ramp, decoder, context):
    """The real runtime behind a Runner: bad codes and a bad history are refused with InputError, not a crash."""
    run = programs.runner(flow_name, "windowed").run
    c = codes(decoder, context + ramp[0], 0)
    with pytest.raises(InputError, match="found 99999"):
        run(method_name("windowed"), (c.index_fill(2, torch.tensor([0]), 99999), _history(context)))
    with pytest.raises(InputError, match="history"):
        run(method_name("windowed"), (c, _history(context + 1)))
    for bad in (0, max(ramp) + 1):  # a chunk outside the range never reaches the runtime
        with pytest.raises(InputError, match=rf"chunk of {bad}$"):
            run(method_name("windowed"), (codes(decoder, context + bad, 0), _history(context)))


def _weight_bytes(decoder) -> int:
    """Bytes of the constants an exported program holds: the prepared decoder's tensors (prepare
    folds the codebooks and drops cluster_usage, so the raw parameters overcount)."""
    from c2w_export.program.prepare import prepare

    return sum(t.numel() * t.element_size() for t in prepare(decoder).state_dict().values())


def test_multi_method_pte_shares_weights(decoder, ramp, context, pytestconfig, tmp_path):
    """One .pte holding both variants' methods carries the weights once: it is smaller than the two
    single-variant files by about one copy of the weights.

    Measured on tiny, where the per-method XNNPACK graph is not small next to the weights, so the
    bound is on the weights: the shared file saves at least 0.8 of them."""
    require_flow(pytestconfig, "executorch_xnnpack")
    flow = FLOWS["executorch_xnnpack"]
    both, _ = build(decoder, flow, ["windowed", "stateful"], max(ramp), context, tmp_path / "both", multi_method=True, windows=1)
    one, _ = build(decoder, flow, ["windowed", "stateful"], max(ramp), context, tmp_path / "one", windows=1)
    multi, singles, weights = both[0].bytes, sum(r.bytes for r in one), _weight_bytes(decoder)
    assert {r.path for r in both} == {both[0].path} and len({r.path for r in one}) == 2
    print(f"2-method .pte {multi} B, single-method files {singles} B, weights {weights} B")
    assert singles - multi >= 0.8 * weights, "a second copy of the weights is in the multi-method file"


def test_gate_fails_a_program_right_only_at_the_example_size(decoder, context, monkeypatch, tmp_path):
    """A deliberate dynamic-shape bug: the exported stateful program advances its position by the
    traced chunk (25, the example export traces) instead of the chunk it was called with, as a
    static method would have. The stages checked on the example window alone (prepare, export)
    pass; the run stage, whose calls draw chunk sizes (25, 1, one between), fails and is named."""
    from c2w_export.model.decoder import POSITION
    from c2w_export.program import prepare as pp

    real = pp.prepare

    def traced_position(dec):
        p = real(dec)
        step = p.step

        def stepped(codes, state, *args, **kwargs):
            wav, new = step(codes, state, *args, **kwargs)
            if POSITION in new:
                new[POSITION] = state[POSITION] + 25
            return wav, new
        p.step = stepped
        return p

    good, _ = build(decoder, FLOWS["torch_export"], ["stateful"], 25, context, tmp_path / "ok")
    assert good[0].passed, good[0].failure()
    monkeypatch.setattr(pp, "prepare", traced_position)
    results, _ = build(decoder, FLOWS["torch_export"], ["stateful"], 25, context, tmp_path / "bad")
    r = results[0]
    assert r.stages["prepare"].within(r.tolerance) and r.stages["export"].within(r.tolerance), r.failure()
    assert not r.passed and "stage 'run' diverged" in r.failure(), r.failure()
