"""Windowed programs of every flow at every ramp chunk against independent references: the build
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


def test_stages_within_tolerance(windowed, flow_name, chunk, numerics_log):
    """Every compared stage (export, lower, run) of every program is within the flow's tolerance of eager."""
    results, _ = windowed
    r = results[method_name("windowed", chunk)]
    numerics_log.append(numerics_row(flow_name, "windowed", chunk, r.diff, r.stages))
    assert r.passed, r.failure()
    assert list(r.stages) == FLOWS[flow_name].compared


def _history(h: int) -> torch.Tensor:
    return torch.tensor([h], dtype=torch.int64)


def test_output_contract(programs, windowed, flow_name, chunk, decoder, context, oracle):
    """Shape [1, chunk*hop], float32, finite, deterministic, within tolerance of upstream's decode
    of a fresh window, with a full history and at a stream start (no history, a partial one)."""
    run = programs.runner(flow_name, "windowed").run
    method = method_name("windowed", chunk)
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


@settings(max_examples=6)
@given(data=st.data())
def test_drawn_windows(programs, windowed, flow_name, chunk, decoder, context, oracle, data):
    """Drawn code patterns and histories through every program, against upstream's decode of the
    same window without its absent frames."""
    cfg = decoder.config
    c = data.draw(code_windows(cfg.num_quantizers, context + chunk, cfg.codebook_size))
    h = data.draw(st.integers(0, context))
    run = programs.runner(flow_name, "windowed").run
    d = compare(run(method_name("windowed", chunk), (c, _history(h)))[0], oracle.window(c, context, h))
    assert d.within(tolerance(flow_name)), f"history {h} vs upstream: {d.describe()}"


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
    results, _ = build(bad, FLOWS["torch_export"], ["windowed"], ramp[:1], context, tmp_path, reference=decoder)
    r = results[0]
    assert not r.passed, f"perturbation passed the gate: {r.diff.describe()}"
    assert all(not d.within(r.tolerance) for d in r.stages.values()), r.failure()
    assert "torch_export chunk_" in r.failure() and "diverged from the float32 eager decoder" in r.failure()


def test_export_refuses_perturbed_program(model_dir, decoder, ramp, context, tmp_path):
    """export_artifacts with a perturbed module of the checkpoint raises ParityError and writes nothing."""
    from c2w_export.program.pipeline import ParityError
    from c2w_export.ship.export import export_artifacts

    bad = copy.deepcopy(decoder)
    with torch.no_grad():
        PERTURBED[0][1](bad).mul_(1 + PERTURBATION)
    with pytest.raises(ParityError, match="not shipped, over tolerance"):
        export_artifacts(model_dir, tmp_path, ramp=ramp[:1], context=context, backend="torch_export",
                         variants=["stateful"], decoder=bad, progress=lambda s: None)
    assert list(tmp_path.iterdir()) == []


def _late_history(right):
    """A window builder whose history is one frame late (its last frame repeated, its first lost)."""
    def late(hist, new, chunk, ctx):
        if hist.shape[-1] > 1:
            hist = torch.cat([hist[:, :, :1], hist[:, :, :-1]], -1)
        return right(hist, new, chunk, ctx)
    return late


def _history_off_by_one(right):
    """A window builder that claims one frame of history more than it has (while it has fewer than context)."""
    def wrong(hist, new, chunk, ctx):
        window, h = right(hist, new, chunk, ctx)
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

    run = ModuleLoaded({method_name("windowed", c): make_variant(decoder, "windowed", c, context) for c in ramp}).run
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
        self.methods, self.calls = ["chunk_2"], 0

    def run(self, method, inputs):
        self.calls += 1
        return (torch.zeros(1),)


BAD_INPUT = [  # (id, (codes, history) -> bad inputs, message)
    ("int32", lambda c, h: (c.to(torch.int32), h), "must be int64"),
    ("short", lambda c, h: (c[:, :, 1:], h), "T=74 frames"),
    ("wrong-q", lambda c, h: (c[:, 1:], h), "Q=16"),
    ("out-of-range", lambda c, h: (c.index_fill(2, torch.tensor([5]), 2048), h), "found 2048 at index"),
    ("negative", lambda c, h: (c.index_fill(2, torch.tensor([0]), -3), h), "found -3"),
    ("no-history", lambda c, h: (c,), r"^chunk_2 takes 2 inputs \(codes, history\), got 1$"),
    ("history-too-long", lambda c, h: (c, h + 1), "must be 0..72"),
    ("history-negative", lambda c, h: (c, h - 73), "history.*non-negative"),
    ("history-float", lambda c, h: (c, h.float()), "history"),
    ("history-shape", lambda c, h: (c, h.repeat(2)), "history"),
]


@pytest.mark.parametrize("make,message", cases(BAD_INPUT))
def test_runner_rejects_bad_input_before_runtime(decoder, make, message):
    spy = Spy()
    runner = Runner("spy", spy, {"chunk_2": Windowed(decoder, 2, 72).spec()}, decoder.config.codebook_size)
    c, h = codes(decoder, 74, 0), _history(72)
    runner.run("chunk_2", (c, h))
    assert spy.calls == 1
    with pytest.raises(InputError, match=message):
        runner.run("chunk_2", make(c, h))
    assert spy.calls == 1, "bad input reached the runtime"


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
     "unknown method 'chunk_9'; this program has ['chunk_2']"),
    ("dispatch-unknown", lambda d, r: Dispatch({"chunk_2": r}).run("chunk_9", ()), FlowError,
     "no program for method 'chunk_9'; have ['chunk_2']"),
    ("absent-method", lambda d, r: Runner("spy", Spy(), {"chunk_4": Windowed(d, 4, 72).spec()}, 2048), FlowError,
     "spy: program has no method(s) ['chunk_4']; it has ['chunk_2']"),
    ("runtime-raises", lambda d, r: Runner("spy", _Broken(RuntimeError("boom")), r.specs, 2048).run("chunk_2", _good(d)),
     FlowError, "spy: method chunk_2 failed in its runtime: RuntimeError: boom"),
    ("wrong-output-count", lambda d, r: Runner("spy", _Broken((torch.zeros(1),) * 2), r.specs, 2048).run("chunk_2", _good(d)),
     FlowError, "spy: method chunk_2 returned 2 outputs, its spec says 1"),
]


def _good(decoder):
    return codes(decoder, 74, 0), _history(72)


@pytest.mark.parametrize("fails,error,message", cases(RUNNER_ERRORS))
def test_runner_errors_name_the_method_and_the_program(decoder, fails, error, message):
    runner = Runner("spy", Spy(), {"chunk_2": Windowed(decoder, 2, 72).spec()}, decoder.config.codebook_size)
    with pytest.raises(error) as e:
        fails(decoder, runner)
    assert str(e.value) == message


def test_runner_names_the_bad_state_tensor(decoder):
    spec = Stateful(decoder, 2).spec()
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
        run(method_name("windowed", ramp[0]), (c.index_fill(2, torch.tensor([0]), 99999), _history(context)))
    with pytest.raises(InputError, match="history"):
        run(method_name("windowed", ramp[0]), (c, _history(context + 1)))


def _weight_bytes(decoder) -> int:
    """Bytes of the constants an exported program holds: the prepared decoder's tensors (prepare
    folds the codebooks and drops cluster_usage, so the raw parameters overcount)."""
    from c2w_export.program.prepare import prepare

    return sum(t.numel() * t.element_size() for t in prepare(decoder).state_dict().values())


def test_multi_method_pte_shares_weights(programs, decoder, ramp, context, pytestconfig, tmp_path):
    """One .pte holding every ramp chunk as a method carries the weights once.

    On the tiny config the per-method XNNPACK graph (~0.2 MB) is not small next to the weights
    (~1.7 MB), so the 1.05x-of-single bound is checked at real size (test_real.py); here: the
    extra bytes per added method are graph, not another copy of the weights."""
    require_flow(pytestconfig, "executorch_xnnpack")
    from c2w_export.program.pipeline import build

    results, _ = programs.get("executorch_xnnpack", "windowed")
    multi_path = next(iter(results.values())).path
    assert {r.path for r in results.values()} == {multi_path} and len(results) == len(ramp)
    single_results, _ = build(decoder, FLOWS["executorch_xnnpack"], ["windowed"], ramp[:1], context, tmp_path, windows=1)
    single, multi, weights = single_results[0].bytes, multi_path.stat().st_size, _weight_bytes(decoder)
    per_method_graph = single - weights
    extra_per_method = (multi - single) / max(len(ramp) - 1, 1)
    print(f"{len(ramp)}-method .pte {multi} B, single {single} B ({multi / single:.2f}x), weights {weights} B, "
          f"extra per method {extra_per_method:.0f} B vs single-method graph {per_method_graph} B")
    assert multi < single + 0.5 * weights, "a second copy of the weights is in the multi-method file"
    assert extra_per_method <= 1.1 * per_method_graph
