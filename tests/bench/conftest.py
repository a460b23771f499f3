"""Benchmark session: our own fields beside pytest-benchmark's, written to reports/bench-extra.json
by complete runs only. Every run writes its session id to reports/.bench-session; the report
builder (c2w_export.report.bench) refuses to build when bench-extra.json is not from that run, so a
filtered or failed run never rewrites the committed reports."""

import json
import os
import uuid
from pathlib import Path

import pytest

# tox -e bench-real points this at reports/real so the tiny reports stay beside it.
REPORTS = Path(os.environ.get("C2W_REPORTS", Path(__file__).resolve().parents[2] / "reports"))
SESSION = uuid.uuid4().hex
EXTRA: dict = {}


@pytest.fixture(scope="session")
def bench_extra(preset_name, ramp, context):
    EXTRA.update({"session": SESSION, "config": preset_name, "ramp": ramp, "context": context, "programs": [],
                  "streams": [], "flops": [], "rss": [], "context_study": [], "schedules": [], "profiles": [], "peaks": [],
                  "static_vs_dynamic": [],
                  "offline_gflop_per_audio_s": None})
    return EXTRA


def _partial(session, exitstatus) -> str | None:
    opt = session.config.option
    if exitstatus != 0 or session.testsfailed:
        return "a test failed"
    if opt.keyword or opt.maxfail or getattr(opt, "lf", False):
        return "-k / -x / --lf"
    if not EXTRA:
        return "no benchmark ran"
    return None


def pytest_sessionfinish(session, exitstatus):
    if not session.config.getoption("--bench"):
        return
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / ".bench-session").write_text(SESSION)
    why = _partial(session, exitstatus)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if why:
        if reporter:
            reporter.write_line(f"{REPORTS}/bench-extra.json not rewritten: partial run ({why})")
        return
    (REPORTS / "bench-extra.json").write_text(json.dumps(EXTRA, indent=2))
