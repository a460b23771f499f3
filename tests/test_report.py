"""The bench report's goal table (report/bench.py): each goal judged from the run's own fields, and
a goal this run did not measure said as such, never passed."""

from c2w_export.report.bench import _goals


def _extra(config, **over):
    extra = {"config": config,
             "programs": [{"flow": "executorch_xnnpack", "variant": "stateful", "method": "stateful", "chunk": "1..25",
                           "lower_s": 35.0, "delegation": {"partitions": 2, "outside_ops": 31},
                           "plan_bytes": 164_180_000}],
             "rss": [{"flow": "executorch_xnnpack", "variant": "stateful", "base_kb": 1000, "file_bytes": 1024 * 1000,
                      "load_peak_kb": 2400, "run_peak_kb": 2300, "first_call_s": 1.1, "warm_call_s": 1.0}],
             "static_vs_dynamic": [{"variant": "stateful", "chunk": c, "dynamic_ms": d, "static_ms": 1.0}
                                   for c, d in ((1, 1.04), (2, 0.96), (25, 1.0))]}
    return {**extra, **over}


def _verdicts(lines):
    return {row.split(" | ")[0].lstrip("| "): row.rstrip(" |").rsplit(" | ", 1)[1] for row in lines if row.startswith("| ") and "stateful" in row}


def test_goal_table_judges_each_goal_from_the_run():
    real = _verdicts(_goals(_extra("real")))
    assert real == {"methods per (variant, precision)": "yes", "partitions / ops outside per XNNPACK method": "no",
                    "the method's memory plan (non-constant buffers)": "no",
                    "dynamic / static call, chunks 1, 2, 25": "yes", "load peak / running peak vs the file": "yes",
                    "first chunk after load / warm call": "yes"}
    tiny = _verdicts(_goals(_extra("tiny")))  # the lowering goal is set for tiny, the memory and speed ones for real
    assert tiny == {"methods per (variant, precision)": "yes", "lowering one XNNPACK variant": "yes",
                    "partitions / ops outside per XNNPACK method": "no"}


def test_a_goal_the_run_did_not_measure_is_not_passed():
    extra = _extra("real")
    extra["rss"][0] = {k: v for k, v in extra["rss"][0].items() if k != "warm_call_s"}  # an older memory.py
    extra["static_vs_dynamic"] = [{**r, "dynamic_ms": 1.2} for r in extra["static_vs_dynamic"]]
    got = _verdicts(_goals(extra))
    assert got["first chunk after load / warm call"] == "not measured in this run"
    assert got["dynamic / static call, chunks 1, 2, 25"] == "no"


def test_the_tolerance_table_in_docs_is_the_installed_one(monkeypatch):
    """docs/gate.md holds program/tolerances.py's table as it is; a changed entry makes them differ."""
    from pathlib import Path

    from c2w_export.program import tolerances as t

    doc = (Path(__file__).parents[1] / "docs" / "gate.md").read_text()
    table = doc.split("<!-- tolerance-table: program/tolerances.markdown_table() -->\n")[1].split("\n<!-- /tolerance-table -->")[0]
    assert table == t.markdown_table(), "docs/gate.md's tolerance table is stale: paste markdown_table() into it"
    monkeypatch.setitem(t.TOLERANCES, ("eager", "float32"), t.Tolerance(1.0, 1.0, "a deliberate change"))
    assert table != t.markdown_table()


def test_the_frontier_writes_a_row_per_precision(model_dir, tmp_path):
    """report/frontier.py end to end on tiny (tox -e frontier runs it at real size): a built precision's
    row with its numbers, and one that cannot be built with why."""
    from c2w_export.report import frontier

    out = tmp_path / "frontier.md"
    # chunks 1..25: the session's own stateful XNNPACK program (the lowering cache), not one more lowering
    assert frontier.main(["--model", model_dir, "--out", str(out), "--precisions", "fp32", "int8-linears",
                          "--chunks", "1", "25", "--frames", "26"]) == 0
    rows = {line.split(" | ")[0]: line for line in out.read_text().splitlines() if line.startswith("| fp32 ") or
            line.startswith("| int8-linears ")}
    assert rows["| fp32"].endswith("| pass |") and "not built: " in rows["| int8-linears"], rows


def test_the_fp16_sensitivity_covers_every_part(decoder, tmp_path, monkeypatch):
    """report/sensitivity.py on tiny (tox -e sensitivity runs it at real size): every part measured alone; kept
    cumulatively, all of them decode as the fp32 decoder does (so no part of the decoder is missing from
    PARTS, and the float32 parts are really float32); the shipped fp16-mixed lands between fp16 throughout
    and that. With a part left out of PARTS, the cumulative end stays at fp16 level: the check fails."""
    from c2w_export.report import sensitivity

    m = sensitivity.measure(decoder, frames=5, progress=lambda s: None)
    assert [r["label"] for r in m["alone"]] == list(sensitivity.PARTS)
    assert m["cumulative"][-1]["snr_db"] > 90, m["cumulative"][-1]  # fp32 noise, ~117 dB on tiny
    assert m["base"]["snr_db"] < m["chosen"][0]["snr_db"] < 90, (m["base"], m["chosen"])
    # every part kept float32 adds 2 bytes a weight, conv weights too (fp16_weights): all but RoPE's float32 buffers
    end = m["cumulative"][-1]["pte_bytes"]
    assert m["chosen"][0]["pte_bytes"] < end and 0.99 * m["fp16_params_bytes"] < end <= m["fp16_params_bytes"], m
    assert "## Each part alone in float32" in sensitivity.table(m, "tiny")

    monkeypatch.setattr(sensitivity, "PARTS", {k: v for k, v in sensitivity.PARTS.items() if k != "decoder.block2"})
    broken = sensitivity.measure(decoder, frames=5, progress=lambda s: None)
    assert broken["cumulative"][-1]["snr_db"] < 80, broken["cumulative"][-1]


def test_the_time_budget_names_files_lowerings_and_the_slowest_tests():
    """reports/parity.md's 'where the time went', by hand: a program lowered twice is said so."""
    from c2w_export.report.parity import time_section

    lines = time_section({"wall_s": 480.0, "workers": 2, "test_s": 900.0, "files": {"tests/a.py": 100.0, "tests/b.py": 800.0},
                          "slowest": [("tests/b.py::test_x", 300.0)], "lowered": 5, "distinct": 4, "lowering_s": 200.0,
                          "hits": 7, "discarded": 0, "by_test": {"tests/a.py::test_y": (["stateful (xnnpack)"], 50.0),
                                                                 "tests/b.py::test_x": (["windowed (xnnpack)"] * 2, 150.0)}})
    assert "8.0 min wall with 2 worker(s); 15.0 worker-minutes of tests (setup, call and teardown)." in lines
    assert ("Lowerings: 5 method program(s) lowered (4 distinct, 1 lowered again) in 200 s; 7 read back from the "
            "lowering cache; 0 corrupt cache entr(ies) discarded.") in lines
    files = [line for line in lines if line.startswith("| tests/")]
    assert files == ["| tests/b.py | 800.0 |", "| tests/a.py | 100.0 |"]  # slowest first
    assert "| `tests/b.py::test_x` | 300.0 |" in lines
    lowered_by = [line for line in lines if line.startswith("| `") and line.count("|") == 4]
    assert lowered_by == ["| `tests/b.py::test_x` | windowed (xnnpack), windowed (xnnpack) | 150.0 |",
                          "| `tests/a.py::test_y` | stateful (xnnpack) | 50.0 |"]  # the costliest first
