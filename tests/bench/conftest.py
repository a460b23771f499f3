"""Benchmark session: our own fields beside pytest-benchmark's, written to reports/bench-extra.json."""

import json
import os
from pathlib import Path

import pytest

# tox -e bench-real points this at reports/real so the tiny reports stay beside it.
REPORTS = Path(os.environ.get("C2W_REPORTS", Path(__file__).resolve().parents[2] / "reports"))


@pytest.fixture(scope="session")
def bench_extra(preset_name, ramp, context):
    data = {"config": preset_name, "ramp": ramp, "context": context, "programs": [], "streams": [], "flops": [],
            "rss": [], "context_study": [], "offline_gflop_per_audio_s": None}
    yield data
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "bench-extra.json").write_text(json.dumps(data, indent=2))
