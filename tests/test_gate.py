"""The gate's own parts, each shown failing: the compare helper, the tolerance table, flows as data
(stage order), and the CLI's backend mapping."""

import math

import pytest
import torch

from c2w_export.program.compare import Diff, combine, compare
from c2w_export.program.flows import FLOWS, Export, Flow, FlowError, Load, LoadEager, Lower, SerializePte, flow_for
from c2w_export.program.tolerances import TOLERANCES, Tolerance, tolerance
from helpers import cases

TOL = Tolerance(1e-3, 60.0, "for this test")


def _diff(max_abs, snr):
    return Diff(max_abs, (0,), snr, max_abs / 2, 10)


WITHIN = [
    ("both-hold", _diff(1e-3, 60.0), True),
    ("max-abs-over-alone", _diff(1.01e-3, 80.0), False),
    ("snr-under-alone", _diff(1e-4, 59.9), False),
    ("both-fail", _diff(1.0, 0.0), False),
    ("identical", _diff(0.0, math.inf), True),
    ("nan", _diff(math.inf, -math.inf), False),
]


@pytest.mark.parametrize("diff,expected", cases(WITHIN))
def test_within_needs_both_bounds(diff, expected):
    assert diff.within(TOL) is expected


def test_compare_reports_max_abs_index_and_snr():
    ref = torch.ones(2, 5)
    got = ref.clone()
    got[1, 3] += 0.5
    d = compare(got, ref)
    assert d.max_abs == pytest.approx(0.5) and d.index == (1, 3)
    assert d.snr_db == pytest.approx(10 * math.log10(10 / 0.25))
    assert "at (1, 3)" in d.describe()


def test_compare_nan_never_passes_and_says_so():
    got = torch.zeros(4)
    got[2] = float("nan")
    d = compare(got, torch.ones(4))
    assert d.index == (2,) and d.numel == 4 and not d.within(Tolerance(math.inf, -math.inf, "anything"))
    assert "SNR=-inf dB" in d.describe()


DESCRIBE = [  # (id, actual, reference, describe())
    ("equal", [1.0, 2.0], [1.0, 2.0], "max_abs=0 at (0,), SNR=inf dB, mean_abs=0"),
    ("finite", [1.0, 2.5], [1.0, 2.0], "max_abs=0.5 at (1,), SNR=13.0 dB, mean_abs=0.25"),
    ("silent-reference", [0.0, 1.0], [0.0, 0.0], "max_abs=1 at (1,), SNR=-inf dB, mean_abs=0.5"),
    ("quiet-reference", [0.6], [0.5], "max_abs=0.1 at (0,), SNR=14.0 dB, mean_abs=0.1"),
    ("beyond-float32-squares", [3e20], [1e20], "max_abs=2e+20 at (0,), SNR=-6.0 dB, mean_abs=2e+20"),
    ("empty", [], [], "max_abs=0 at (), SNR=inf dB, mean_abs=0"),
]


@pytest.mark.parametrize("actual,reference,text", cases(DESCRIBE))
def test_describe_by_hand(actual, reference, text):
    assert compare(torch.tensor(actual), torch.tensor(reference)).describe() == text


def test_compare_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shape mismatch"):
        compare(torch.zeros(3), torch.zeros(4))


def test_combine_takes_the_worst_of_each():
    a, b = _diff(1e-3, 90.0), _diff(1e-5, 50.0)
    b = Diff(1e-5, (3,), 50.0, 7e-4, 4)
    c = combine([a, b])
    assert (c.max_abs, c.index, c.snr_db, c.mean_abs, c.numel) == (1e-3, (0,), 50.0, 7e-4, 14)


def test_unknown_tolerance_key_raises_naming_it():
    with pytest.raises(KeyError, match="no tolerance for flow='nope'"):
        tolerance("nope")
    with pytest.raises(KeyError, match="precision='int4'"):
        tolerance("executorch_xnnpack", "int4")


def test_every_tolerance_entry_says_why():
    from c2w_export.env import FP16_ARITHMETICS

    for key, entry in TOLERANCES.items():
        per_arithmetic = entry if isinstance(entry, dict) else None
        assert per_arithmetic is None or set(per_arithmetic) == set(FP16_ARITHMETICS), key  # one for every arithmetic
        for tol in (per_arithmetic or {"": entry}).values():
            assert len(tol.why) > 20, key
    for name in FLOWS:
        tolerance(name)  # every flow has a gate


def test_flow_stage_order_is_enforced():
    with pytest.raises(FlowError, match="stage 'lower' cannot follow 'start'"):
        Flow("bad", "executorch", "x", (Lower("xnnpack"), SerializePte(), Load(lambda p: None)))
    with pytest.raises(FlowError, match="stage 'export' cannot follow 'serialize'"):
        Flow("bad", "executorch", "x", (Export(), SerializePte(), Export(), Load(lambda p: None)))
    with pytest.raises(FlowError, match="the last stage must be 'load'"):
        Flow("bad", "executorch", "x", (Export(), Lower("xnnpack")))
    assert Flow("ok", "eager", None, (LoadEager(),)).compared == ["run"]


BACKENDS = [
    ("torch-export-ignores-partitioner", "torch_export", "xnnpack", "torch_export"),
    ("executorch-xnnpack", "executorch", "xnnpack", "executorch_xnnpack"),
    ("executorch-portable", "executorch", "portable", "executorch_portable"),
]


@pytest.mark.parametrize("backend,partitioner,flow", cases(BACKENDS))
def test_flow_for_maps_cli_options(backend, partitioner, flow):
    assert flow_for(backend, partitioner).name == flow


@pytest.mark.parametrize("backend,partitioner,message", cases([
    ("eager", "eager", None, "eager is the reference"),
    ("unknown-backend", "tflite", None, "unknown backend 'tflite'"),
    ("unknown-partitioner", "executorch", "qnn", "no partitioner 'qnn'"),
    ("no-partitioner", "executorch", None, "no partitioner None"),
]))
def test_flow_for_refuses_bad_options(backend, partitioner, message):
    with pytest.raises(FlowError, match=message):
        flow_for(backend, partitioner)


BROKEN_FOLDS = [  # (id, prepare's function, its broken replacement given the real one)
    ("snake-alpha-and-inverse-beta-swapped", "snake_constants", lambda real: lambda a, b: tuple(reversed(real(a, b)))),
    ("transposed-conv-taps-swapped", "phase_weight", lambda real: lambda w, s: real(w, s).flip(-1)),
]


@pytest.mark.parametrize("name,broken", cases(BROKEN_FOLDS))
def test_a_broken_fold_fails_at_the_prepare_stage(decoder, ramp, context, tmp_path, monkeypatch, name, broken):
    """The prepared (folded) module is compared with the untouched decoder: the real fold passes,
    a broken one fails, named at stage 'prepare'."""
    from c2w_export.program import prepare as pp
    from c2w_export.program.pipeline import build

    flow = FLOWS["torch_export"]
    assert flow.compared[0] == "prepare"
    results, _ = build(decoder, flow, ["stateful"], 3, context, tmp_path / "ok", windows=1)
    assert results[0].passed, results[0].failure()
    monkeypatch.setattr(pp, name, broken(getattr(pp, name)))
    results, _ = build(decoder, flow, ["stateful"], 3, context, tmp_path / "bad", windows=1)
    assert not results[0].stages["prepare"].within(results[0].tolerance), results[0].stages["prepare"].describe()
    assert "stage 'prepare' diverged" in results[0].failure()


def test_verify_report_table_and_json_by_hand():
    """What `verify` prints and emits, against hand-written text: a row with a diff (finite and
    infinite SNR, the tolerance) and a row without (hashes), PASS and FAIL with its detail."""
    import json

    from c2w_export.ship.verify import EXIT_PARITY, Report, Row

    rows = [Row("hashes", "2 file(s)", None, None, True),
            Row("windows", "windowed", _diff(2.5e-6, 110.04), TOL, True),
            Row("stream", "stateful (9 frames)", _diff(0.0, math.inf), TOL, False, "over tolerance: x")]
    r = Report(rows, EXIT_PARITY)
    assert r.table().splitlines() == [
        "check      target                        max_abs   SNR dB       tol  result",
        "hashes     2 file(s)                           -        -         -  PASS",
        "windows    windowed                      2.5e-06    110.0     0.001  PASS",
        "stream     stateful (9 frames)                 0      inf     0.001  FAIL  over tolerance: x",
    ]
    j = json.loads(r.to_json())
    assert (j["exit_code"], j["passed"]) == (1, False)
    assert j["rows"][0] == {"check": "hashes", "target": "2 file(s)", "passed": True, "warning": False, "detail": "",
                            "diff": None, "tolerance": None}
    assert j["rows"][1]["diff"] == {"max_abs": 2.5e-6, "index": [0], "snr_db": 110.04, "mean_abs": 1.25e-6}
    assert j["rows"][1]["tolerance"] == {"max_abs": 1e-3, "min_snr_db": 60.0, "why": "for this test"}
    assert j["rows"][2]["diff"]["snr_db"] is None
    assert json.loads(Report(rows[:1]).to_json())["passed"] is True


class _Lazy:
    """A runtime that records which methods it was asked to preload (or fails doing it) and the
    shapes of each call it runs."""

    def __init__(self, specs, fail=False):
        self.specs, self.methods, self.fail, self.preloaded, self.calls = specs, list(specs), fail, [], []

    def preload(self, methods):
        if self.fail:
            raise RuntimeError("no memory")
        self.preloaded.append(sorted(methods))

    def run(self, method, inputs):
        self.calls.append((method, [tuple(x.shape) for x in inputs]))
        return tuple(torch.zeros(s.shape) for s in self.specs[method].outputs)


def _dispatch(*loaded):
    from c2w_export.program.runner import Dispatch, Runner

    one = [Runner("executorch_xnnpack", lo, lo.specs, 2048) for lo in loaded]  # one per program
    return Dispatch({m: r for r in one for m in r.specs})


def test_preload_loads_each_program_once_and_warms_each_method_at_its_largest_chunk(decoder):
    """Cold start: every program loads its methods in one call, then each method runs once at its
    largest chunk (so a stream's first chunk is a warm call); warm=False only loads."""
    from c2w_export.program.variants import Stateful, Windowed

    windowed, stateful = Windowed(decoder, 25, 72).spec(), Stateful(decoder, 8).spec()
    a, b = _Lazy({"windowed": windowed}), _Lazy({"stateful": stateful})
    d = _dispatch(a, b)
    d.preload()
    assert a.preloaded == [["windowed"]] and b.preloaded == [["stateful"]]
    assert d.methods == ["stateful", "windowed"]
    assert a.calls == [("windowed", [(1, 16, 97), (1,)])]
    assert b.calls == [("stateful", [(1, 16, 8)] + [s.shape for s in stateful.inputs[1:]])]
    c = _Lazy({"windowed": windowed})
    _dispatch(c).preload(warm=False)
    assert c.preloaded == [["windowed"]] and c.calls == []


def test_preload_failure_names_the_flow_and_the_cause(decoder):
    from c2w_export.program.variants import Windowed

    with pytest.raises(FlowError, match=r"executorch_xnnpack: loading methods failed: RuntimeError: no memory"):
        _dispatch(_Lazy({"windowed": Windowed(decoder, 2, 72).spec()}, fail=True)).preload()


FLOW_GROUPS = [  # (id, node id, the xdist work unit it joins)
    ("flow-param", "tests/test_parity.py::test_drawn_windows[executorch_xnnpack]", "executorch_xnnpack"),
    ("flow-last", "tests/test_streaming.py::test_windowed_stream_vs_upstream[T7-executorch_portable]", "executorch_portable"),
    ("named-test", "tests/test_parity.py::test_multi_method_pte_shares_weights", "executorch_xnnpack"),
    ("no-flow", "tests/test_gate.py::test_describe_by_hand[equal]", "tests/test_gate.py::test_describe_by_hand[equal]"),
]


@pytest.mark.parametrize("nodeid,group", cases(FLOW_GROUPS))
def test_xdist_groups_each_flow_on_one_worker(nodeid, group):
    """tox -e parity's scheduler: a test joins its flow's work unit (lowered once, on one worker)."""
    from conftest import flow_group

    assert flow_group(nodeid) == group
