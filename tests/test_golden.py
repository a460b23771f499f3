"""Golden numerics: eager and every flow against the committed golden sets (plain and stress),
the sets themselves against upstream, and the behaviour only the stress checkpoint reaches
(output clamp, usage clamp, RMSNorm eps) shown to fail the gate when it is removed."""

import copy
import math

import numpy as np
import pytest
import torch

import c2w_export.model.decoder as decoder_module
from c2w_export.model.layers import RMSNorm
from c2w_export.program.compare import compare
from c2w_export.program.streaming import stream_stateful
from c2w_export.report import golden as gd
from helpers import ALL_FLOWS, ProgramCache, initial_state, numerics_row, require_flow
from c2w_export.conformance.upstream import Oracle

GOLDEN_DIR = __import__("pathlib").Path(__file__).parent / "golden"
STRESS = "tiny_stress_seed0"


@pytest.fixture(scope="session")
def golden():
    return gd.load_golden(GOLDEN_DIR)


@pytest.fixture(scope="session")
def stress_golden():
    return gd.load_golden(GOLDEN_DIR, STRESS)


@pytest.fixture(scope="session")
def golden_programs(programs, decoder, tmp_path_factory, ramp, context):
    """Stateful programs of the golden decoder (tiny seed 0): the session's own programs when the
    session runs on that checkpoint (the default), else exported once here."""
    dec = gd.golden_decoder()
    ours, theirs = dec.state_dict(), decoder.state_dict()
    if ours.keys() == theirs.keys() and all(ours[k].shape == theirs[k].shape and torch.equal(ours[k], theirs[k]) for k in ours):
        return programs
    return ProgramCache(dec, max(ramp), context, tmp_path_factory.mktemp("golden-programs"))


@pytest.mark.parametrize("name", sorted(gd.GOLDEN_SETS))
def test_golden_set_is_small_and_non_degenerate(name):
    g = gd.load_golden(GOLDEN_DIR, name)
    assert (GOLDEN_DIR / f"{name}.npz").stat().st_size < 100_000
    assert g["codes"].shape == (1, 16, gd.FRAMES) and g["codes"].dtype == np.int64
    assert 0.02 < g["stats"][1] < 1.0, "golden audio is degenerate"


@pytest.mark.parametrize("name", sorted(gd.GOLDEN_SETS))
def test_golden_set_matches_upstream(name):
    """The committed sets hold what the upstream decoder computes on the same weights: a golden set
    written by a broken decoder would fail here."""
    dec, g = gd.golden_decoder(name), gd.load_golden(GOLDEN_DIR, name)
    wav = Oracle(dec).offline(torch.from_numpy(g["codes"]))
    ok, text = gd.check_wav(g, wav, dec.config.hop, f"upstream ({name})", gd.golden_tolerance(name))
    assert ok, text


def test_eager_matches_golden():
    ok, text = gd.check_golden(GOLDEN_DIR)
    print(text)
    assert ok, text


@pytest.mark.parametrize("flow", ALL_FLOWS)
def test_flow_matches_golden(golden, golden_programs, flow, ramp, pytestconfig):
    require_flow(pytestconfig, flow)
    dec = golden_programs.decoder
    run = golden_programs.runner(flow, "stateful").run
    wav = stream_stateful(run, initial_state(dec), torch.from_numpy(golden["codes"]), dec.config.hop, ramp).wav
    ok, text = gd.check_wav(golden, wav, dec.config.hop, flow)
    print(text)
    assert ok, text


@pytest.mark.parametrize("flow", ALL_FLOWS)
def test_flow_matches_stress_golden(stress_golden, stress_programs, flow, ramp, pytestconfig, numerics_log):
    """The stress checkpoint through every flow (the stateful program at its first two ramp chunks,
    and a stream) against its golden set."""
    require_flow(pytestconfig, flow)
    dec = stress_programs.decoder
    run = stress_programs.runner(flow, "stateful").run
    results, _ = stress_programs.get(flow, "stateful")
    r = results["stateful"]
    assert r.passed, r.failure()
    for c in ramp[:2]:
        d = stress_programs.chunk_diff(flow, "stateful", c)
        numerics_log.append(numerics_row(f"{flow} (stress)", "stateful", c, d, r.stages))
        assert d.within(r.tolerance), f"{flow} (stress) at chunk {c}: {d.describe()}"
    wav = stream_stateful(run, initial_state(dec), torch.from_numpy(stress_golden["codes"]), dec.config.hop, ramp).wav
    ok, text = gd.check_wav(stress_golden, wav, dec.config.hop, flow, gd.golden_tolerance(STRESS))
    print(text)
    assert ok, text


def test_drift_is_reported_per_field(golden):
    dec = gd.golden_decoder()
    with torch.no_grad():
        wav = dec(torch.from_numpy(golden["codes"]))[:, 0]
    ok, text = gd.check_wav(golden, wav * (1 + 1e-3), dec.config.hop, "eager")
    assert not ok and "samples" in text and "frame_rms" in text


def test_update_reports_changes(tmp_path):
    """--update reports the drift of a set that changed: a stored sample moved by a known 0.25."""
    assert "new golden set" in gd.update_golden(tmp_path)
    path = tmp_path / f"{STRESS}.npz"
    with np.load(path) as z:
        fields = {k: z[k] for k in z.files}
    fields["samples"][3] += 0.25
    np.savez_compressed(path, **fields)
    report = gd.update_golden(tmp_path)
    line = next(x for x in report.splitlines() if STRESS in x)
    assert "changed: samples max abs 0.25" in line, report


# ---------------------------------------------------------------- what only the stress checkpoint reaches
def _no_eps(dec):
    for m in dec.modules():
        if isinstance(m, RMSNorm):
            m.eps = 0.0
    return dec


MUTATIONS = [
    ("no-output-clamp", "OUTPUT_LIMIT", math.inf, None),
    ("no-usage-clamp", "USAGE_FLOOR", 0.0, None),
    ("no-rmsnorm-eps", None, None, _no_eps),
]


@pytest.mark.parametrize("constant,value,edit", [pytest.param(*m[1:], id=m[0]) for m in MUTATIONS])
def test_stress_gate_fails_without(stress_decoder, stress_golden, monkeypatch, constant, value, edit):
    """Remove the clamp, the usage clamp or the norm eps: the stress checkpoint's decode fails both
    the golden set and upstream (the plain checkpoint would pass: Gaussian weights never reach them)."""
    dec = copy.deepcopy(stress_decoder)
    codes = torch.from_numpy(stress_golden["codes"])
    upstream = Oracle(stress_decoder).offline(codes)
    if constant:
        monkeypatch.setattr(decoder_module, constant, value)
    if edit:
        edit(dec)
    with torch.no_grad():
        wav = dec(codes)[:, 0]
    ok, text = gd.check_wav(stress_golden, wav, dec.config.hop, "mutated", gd.golden_tolerance(STRESS))
    assert not ok, text
    d = compare(wav, upstream)
    assert not d.within(gd.golden_tolerance(STRESS)), d.describe()
