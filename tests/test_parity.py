"""Windowed programs of every flow at every ramp chunk against eager (issue: export pipeline).

Ids read `<flow>-chunk<n>`. Programs are exported once per session (ProgramCache)."""

import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from c2w_export.model.validate import InputError
from c2w_export.program.compare import compare
from c2w_export.program.flows import FLOWS, ModuleLoaded, Loaded
from c2w_export.program.pipeline import check_method
from c2w_export.program.runner import Runner
from c2w_export.program.tolerances import PERTURBATION, tolerance
from c2w_export.program.variants import Windowed, make_variant, method_name
from helpers import cases, code_windows, codes, numerics_row, require_flow


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


def test_output_contract(programs, windowed, flow_name, chunk, decoder, context):
    """Shape [1, chunk*hop], float32, finite, deterministic, within tolerance on a fresh window."""
    run = programs.runner(flow_name, "windowed").run
    method = method_name("windowed", chunk)
    c = codes(decoder, context + chunk, seed=chunk)
    out = run(method, (c,))
    assert len(out) == 1
    wav = out[0]
    assert wav.shape == (1, chunk * decoder.config.hop) and wav.dtype == torch.float32
    assert torch.isfinite(wav).all()
    assert torch.equal(run(method, (c,))[0], wav), "not deterministic"
    with torch.no_grad():
        ref = Windowed(decoder, chunk, context)(c)
    d = compare(wav, ref)
    assert d.within(tolerance(flow_name)), d.describe()


@settings(max_examples=6)
@given(data=st.data())
def test_drawn_windows(programs, windowed, flow_name, chunk, decoder, context, data):
    cfg = decoder.config
    c = data.draw(code_windows(cfg.num_quantizers, context + chunk, cfg.codebook_size))
    run = programs.runner(flow_name, "windowed").run
    with torch.no_grad():
        ref = Windowed(decoder, chunk, context)(c)
    d = compare(run(method_name("windowed", chunk), (c,))[0], ref)
    assert d.within(tolerance(flow_name)), d.describe()


def test_eager_windowed_is_tail_of_full_decode(decoder, chunk, context):
    c = codes(decoder, context + chunk, seed=7)
    with torch.no_grad():
        full = decoder(c)[:, 0]
        win = Windowed(decoder, chunk, context)(c)
    d = compare(win, full[:, context * decoder.config.hop:])
    assert d.within(tolerance("eager_resized")), d.describe()


# ---------------------------------------------------------------- the gate can fail
PERTURBED = [
    ("o_proj", lambda d: d.pre_transformer.layers[0].self_attn.o_proj.weight),
    ("final-conv", lambda d: d.decoder[-1].conv.weight),
    ("codebook", lambda d: d.quantizer.rvq_rest.vq.layers[3]._codebook.embedding_sum),
]


@pytest.mark.parametrize("pick", cases(PERTURBED))
def test_gate_rejects_perturbed_weight(decoder, ramp, context, pick):
    """A 1e-3 relative change of one weight tensor of the exported module must fail parity."""
    chunk = ramp[0]
    bad = copy.deepcopy(decoder)
    with torch.no_grad():
        pick(bad).mul_(1 + PERTURBATION)
    module = make_variant(bad, "windowed", chunk, context)
    reference = make_variant(decoder, "windowed", chunk, context)
    windows = [codes(decoder, context + chunk, s) for s in range(3)]
    d = check_method(ModuleLoaded({"m": module}).run, reference, "m", windows)
    assert not d.within(tolerance("executorch_xnnpack")), f"perturbation passed the gate: {d.describe()}"


def test_gate_rejects_window_off_by_one(decoder, ramp, context):
    """Slicing the window one frame late (a classic off-by-one) must fail parity."""
    chunk = ramp[0]
    c = codes(decoder, context + chunk + 1, seed=3)
    with torch.no_grad():
        good = Windowed(decoder, chunk, context)(c[:, :, 1:])
        shifted = Windowed(decoder, chunk, context)(c[:, :, :-1])
    d = compare(shifted, good)
    assert not d.within(tolerance("executorch_xnnpack")), d.describe()


# ---------------------------------------------------------------- bad input never reaches the runtime
class Spy(Loaded):
    def __init__(self):
        self.methods, self.calls = ["chunk_2"], 0

    def run(self, method, inputs):
        self.calls += 1
        return (torch.zeros(1),)


BAD_INPUT = [
    ("int32", lambda c: c.to(torch.int32), "must be int64"),
    ("short", lambda c: c[:, :, 1:], "T=74 frames"),
    ("wrong-q", lambda c: c[:, 1:], "Q=16"),
    ("out-of-range", lambda c: c.index_fill(2, torch.tensor([5]), 2048), "found 2048 at index"),
    ("negative", lambda c: c.index_fill(2, torch.tensor([0]), -3), "found -3"),
]


@pytest.mark.parametrize("make,message", cases(BAD_INPUT))
def test_runner_rejects_bad_input_before_runtime(decoder, make, message):
    spy = Spy()
    runner = Runner("spy", spy, {"chunk_2": Windowed(decoder, 2, 72).spec()}, decoder.config.codebook_size)
    c = codes(decoder, 74, 0)
    runner.run("chunk_2", (c,))
    assert spy.calls == 1
    with pytest.raises(InputError, match=message):
        runner.run("chunk_2", (make(c),))
    assert spy.calls == 1, "bad input reached the runtime"


def test_loaded_program_rejects_bad_input(programs, flow_name, ramp, decoder, context):
    """The real runtime behind a Runner: bad codes are refused with InputError, not a crash."""
    run = programs.runner(flow_name, "windowed").run
    c = codes(decoder, context + ramp[0], 0).index_fill(2, torch.tensor([0]), 99999)
    with pytest.raises(InputError, match="found 99999"):
        run(method_name("windowed", ramp[0]), (c,))


def _weight_bytes(decoder) -> int:
    return sum(p.numel() * p.element_size() for p in decoder.parameters())


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
