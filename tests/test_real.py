"""Real-size opt-in (--real, tox -e real): the published config with seeded random weights, one
program per variant (chunks 1..25) checked at chunks 2 and 25, torch_export and XNNPACK. Slow: a
real-size XNNPACK lowering takes minutes."""

import pytest
import torch

from c2w_export.program.compare import compare
from c2w_export.program.streaming import steady_tolerance, stream_stateful, stream_windowed
from c2w_export.program.tolerances import tolerance
from c2w_export.program.variants import method_name
from helpers import ProgramCache, codes as _codes, initial_state, numerics_row, offline

pytestmark = pytest.mark.real
REAL_RAMP = [2, 25]
REAL_FLOWS = ("torch_export", "executorch_xnnpack")


@pytest.fixture(scope="module")
def real_decoder(real_model_dir):
    from c2w_export import load_decoder

    return load_decoder(real_model_dir)


@pytest.fixture(scope="module")
def real_programs(real_decoder, context, tmp_path_factory):
    return ProgramCache(real_decoder, max(REAL_RAMP), context, tmp_path_factory.mktemp("real-programs"))


def test_real_output_is_non_degenerate(real_decoder):
    with torch.no_grad():
        y = real_decoder(_codes(real_decoder, 20, 0))
    assert 0.02 <= float(y.std()) <= 0.5 and float((y.abs() >= 1).float().mean()) < 0.01


@pytest.mark.parametrize("variant", ["windowed", "stateful"])
@pytest.mark.parametrize("flow", REAL_FLOWS)
def test_real_programs_within_tolerance(real_programs, flow, variant, numerics_log):
    results, _ = real_programs.get(flow, variant)
    r = results[method_name(variant)]
    print(f"real {flow} {r.spec.method}: {r.diff.describe()}, {r.bytes / 1e6:.0f} MB")
    assert r.passed, r.failure()
    for c in REAL_RAMP:
        d = real_programs.chunk_diff(flow, variant, c)
        numerics_log.append(numerics_row(f"{flow} (real)", variant, c, d, r.stages))
        assert d.within(r.tolerance), f"real {flow} {variant} chunk {c}: {d.describe()}"


@pytest.mark.parametrize("flow", ("eager",) + REAL_FLOWS)
def test_real_stateful_stream_equals_offline(real_decoder, real_programs, flow):
    frames = 3 * real_decoder.config.sliding_window + 1
    codes = _codes(real_decoder, frames, 3)
    run = real_programs.runner(flow, "stateful").run
    got = stream_stateful(run, initial_state(real_decoder), codes, real_decoder.config.hop, REAL_RAMP).wav
    d = compare(got, offline(real_decoder, codes))
    print(f"real stateful stream ({flow}, {frames} frames) vs offline: {d.describe()}")
    assert d.within(tolerance("stateful_stream")), d.describe()


@pytest.mark.parametrize("chunks", [[2], [25]], ids=["chunk2", "chunk25"])
def test_real_windowed_stream_vs_offline(real_decoder, real_programs, context, chunks):
    hop = real_decoder.config.hop
    frames = context + 4 * 25
    codes = _codes(real_decoder, frames, 4)
    run = real_programs.runner("eager", "windowed").run
    got = stream_windowed(run, codes, hop, context, chunks).wav
    ref = offline(real_decoder, codes)
    start, steady = compare(got[:, :context * hop], ref[:, :context * hop]), compare(got[:, context * hop:], ref[:, context * hop:])
    print(f"real windowed stream chunk {chunks[0]} vs offline: start {start.describe()}; steady {steady.describe()}")
    assert start.within(tolerance("eager")), f"the start is exact at any size: {start.describe()}"
    assert steady.within(steady_tolerance(real_decoder, context)), steady.describe()


def test_real_program_file_is_its_weights(real_decoder, real_programs):
    """At real size the weights dominate: the dynamic program's .pte is <= 1.05x the weight bytes
    (one method for every chunk adds graph, not weights)."""
    results, _ = real_programs.get("executorch_xnnpack", "windowed")
    path = next(iter(results.values())).path
    weights = sum(p.numel() * p.element_size() for p in real_decoder.parameters())
    ratio = path.stat().st_size / weights
    print(f"real .pte {path.stat().st_size / 1e6:.1f} MB, weights {weights / 1e6:.1f} MB: {ratio:.3f}x")
    assert ratio <= 1.05
