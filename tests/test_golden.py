"""Golden numerics: eager and every flow against the committed tiny seed-0 set."""

import numpy as np
import pytest
import torch

from c2w_export.program.streaming import stream_stateful
from c2w_export.report import golden as gd
from helpers import ALL_FLOWS, ProgramCache, initial_state, require_flow

GOLDEN_DIR = __import__("pathlib").Path(__file__).parent / "golden"


@pytest.fixture(scope="session")
def golden():
    return gd.load_golden(GOLDEN_DIR)


@pytest.fixture(scope="session")
def golden_programs(programs, decoder, tmp_path_factory, ramp, context):
    """Stateful programs of the golden decoder (tiny seed 0): the session's own programs when the
    session runs on that checkpoint (the default), else exported once here."""
    dec = gd.golden_decoder()
    ours, theirs = dec.state_dict(), decoder.state_dict()
    if ours.keys() == theirs.keys() and all(ours[k].shape == theirs[k].shape and torch.equal(ours[k], theirs[k]) for k in ours):
        return programs
    return ProgramCache(dec, ramp, context, tmp_path_factory.mktemp("golden-programs"))


def test_golden_set_is_small_and_non_degenerate(golden):
    assert (GOLDEN_DIR / gd.GOLDEN_FILE).stat().st_size < 100_000
    assert golden["codes"].shape == (1, 16, gd.FRAMES) and golden["codes"].dtype == np.int64
    assert 0.02 < golden["stats"][1] < 0.5, "golden audio is degenerate"


def test_eager_matches_golden():
    ok, text = gd.check_golden(GOLDEN_DIR)
    print(text)
    assert ok, text


@pytest.mark.parametrize("flow", ALL_FLOWS)
def test_flow_matches_golden(golden, golden_programs, flow, ramp, pytestconfig):
    require_flow(pytestconfig, flow)
    dec = golden_programs.decoder
    run = golden_programs.runner(flow, "stateful").run
    wav = stream_stateful(run, initial_state(dec), torch.from_numpy(golden["codes"]),
                          dec.config.hop, ramp).wav
    ok, text = gd.check_wav(golden, wav, dec.config.hop, flow)
    print(text)
    assert ok, text


def test_drift_is_reported_per_field(golden):
    dec = gd.golden_decoder()
    with torch.no_grad():
        wav = dec(torch.from_numpy(golden["codes"]))[:, 0]
    ok, text = gd.check_wav(golden, wav * (1 + 1e-3), dec.config.hop, "eager")
    assert not ok and "samples" in text and "frame_rms" in text


def test_update_reports_changes(tmp_path):
    first = gd.update_golden(tmp_path)
    assert "new golden set" in first
    again = gd.update_golden(tmp_path)
    assert "changed: samples max abs 0" in again
