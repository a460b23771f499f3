"""`verify()` called directly on small torch_export artifacts (ramp 2, context 26 = the tiny
decoder's receptive field, so the windowed steady state is exact; both variants):
every row it writes, and each of its checks shown failing. The CLI tests (test_cli.py) run the
same paths end to end on the default context; these are fast enough for mutation testing to reach."""

import pytest

from c2w_export import cli
from c2w_export.program.tolerances import tolerance
from c2w_export.ship.verify import EXIT_OK, EXIT_PARITY, verify
from helpers import built_once, cases, manifest_edit

pytestmark = pytest.mark.mutation_first("c2w_export.ship.verify.x_verify__*")

FRAMES = 26 + 2 + 2 + 5  # stream_frames(ramp [2], 5, context 26): context, the ramp, one repeat, a short last chunk


@pytest.fixture(scope="module")
def small(model_dir, tmp_path_factory):
    def build(out):
        assert cli.main(["export", "--model", model_dir, "--out-dir", str(out / "pt2"), "--ramp", "2", "--context", "26",
                         "--backend", "torch_export", "--variant", "both"]) == 0
    return built_once(tmp_path_factory, "artifacts-small", build) / "pt2"


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("other")
    assert cli.main(["synth", "--preset", "tiny", "--seed", "1", "--out", str(out)]) == 0
    return str(out)


@pytest.fixture
def copy(small, tmp_path):
    import shutil

    return shutil.copytree(small, tmp_path / "a")


def test_verify_passes_with_every_row_named(small, model_dir):
    said = []
    rep = verify(small, model_dir, progress=said.append)
    gate = tolerance("torch_export")
    assert rep.exit_code == EXIT_OK and said == [f"loaded 2 method(s) from {small}"]
    assert [(r.check, r.target, r.passed, r.detail) for r in rep.rows] == [
        ("hashes", "2 file(s)", True, ""),
        ("model", "config + weights sha256", True, ""),
        ("contract", "manifest vs checkpoint", True,
         "methods, I/O names, shapes, dtypes, state and order, hop and sample rate match"),
        ("methods", "code2wav_windowed.pt2", True, "1 method(s) by name"),
        ("methods", "code2wav_stateful.pt2", True, "1 method(s) by name"),
        ("windows", "windowed", True, "3 window(s)"),
        ("windows", "stateful", True, "3 window(s)"),
        ("stream", f"windowed ({FRAMES} frames)", True, ""),
        ("stream", f"windowed-start ({FRAMES} frames)", True, ""),
        ("stream", f"windowed-steady ({FRAMES} frames)", True, ""),
        ("stream", f"stateful ({FRAMES} frames)", True, ""),
    ]
    checked = [r for r in rep.rows if r.check in ("windows", "stream")]
    assert all(r.tolerance.max_abs <= gate.max_abs and r.diff.within(gate) and r.diff.numel > 0 for r in checked)


def test_verify_other_checkpoint_fails_model_windows_and_streams(small, other_model):
    rep = verify(small, other_model)
    failed = {(r.check, r.target) for r in rep.rows if not r.passed}
    assert rep.exit_code == EXIT_PARITY
    assert failed >= {("model", "config + weights sha256"), ("windows", "windowed"), ("windows", "stateful"),
                      ("stream", f"stateful ({FRAMES} frames)")}, failed
    model = rep.rows[1]
    assert model.detail == "artifacts were built from a different checkpoint (config match=True, weights match=False)"
    w = next(r for r in rep.rows if r.target == "windowed" and r.check == "windows")
    assert w.detail.startswith("torch_export windowed over tolerance: max_abs=") and not w.diff.within(w.tolerance)
    s = next(r for r in rep.rows if r.check == "stream" and r.target.startswith("stateful"))
    assert s.detail.startswith("over tolerance: ") and not s.passed


LOOSER = [
    ("max-abs-only", {"max_abs": 10.0, "min_snr_db": 95.0}, "max_abs<=10, SNR>=95 dB"),
    ("snr-only", {"max_abs": 3e-5, "min_snr_db": 10.0}, "max_abs<=3e-05, SNR>=10 dB"),
]


@pytest.mark.parametrize("recorded,text", cases(LOOSER))
def test_verify_reports_a_looser_recorded_tolerance_and_checks_at_the_table(copy, model_dir, recorded, text):
    manifest_edit(lambda m: m["programs"][0].__setitem__("tolerance", {**recorded, "why": "trust me"}))(copy)
    rep = verify(copy, model_dir)
    assert rep.exit_code == EXIT_PARITY
    (row,) = [r for r in rep.rows if not r.passed]
    assert (row.check, row.target, row.diff, row.tolerance) == ("tolerance", "windowed", None, tolerance("torch_export"))
    assert row.passed is False
    assert row.detail == (f"manifest records a looser tolerance ({text}) than this c2w-export's table; "
                          "checked at the table's")
    assert next(r for r in rep.rows if r.check == "windows" and r.target == "windowed").tolerance == tolerance("torch_export")


def test_verify_a_tighter_recorded_tolerance_is_not_a_finding(copy, model_dir):
    manifest_edit(lambda m: m["programs"][1].__setitem__("tolerance", {"max_abs": 1e-9, "min_snr_db": 200.0, "why": "x"}))(copy)
    rep = verify(copy, model_dir)
    assert rep.exit_code == EXIT_OK and "tolerance" not in {r.check for r in rep.rows}
