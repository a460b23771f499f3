"""Suite options, Hypothesis profiles and session caches.

Options: --model (path or hub id; default: a tiny synthetic checkpoint generated once per session),
--preset (tiny|real, when no --model), --ramp, --context, --backends, --real (opt in to real-size
tests), --bench (run benchmarks).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from helpers import ALL_FLOWS, ProgramCache, selected_flows

settings.register_profile("dev", max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))



def pytest_addoption(parser):
    g = parser.getgroup("c2w-export")
    g.addoption("--model", default=None, help="model dir or hub id (default: tiny synthetic, generated)")
    g.addoption("--preset", default="tiny", choices=["tiny", "real"], help="synthetic preset when no --model")
    g.addoption("--ramp", default="2,4,8,16,25", help="comma-separated chunk sizes")
    g.addoption("--context", type=int, default=72, help="windowed left context frames")
    g.addoption("--backends", default=",".join(ALL_FLOWS), help="comma-separated flows to test")
    g.addoption("--real", action="store_true", help="also run real-size (slow) tests")
    g.addoption("--bench", action="store_true", help="run benchmarks (tests/bench)")


def pytest_collection_modifyitems(config, items):
    skip_real = pytest.mark.skip(reason="real-size test: opt in with --real (the reference env and tox -e real do)")
    skip_bench = pytest.mark.skip(reason="benchmark: run with --bench (tox -e bench)")
    for item in items:
        if item.get_closest_marker("real") and not config.getoption("--real"):
            item.add_marker(skip_real)
        if item.get_closest_marker("bench") and not config.getoption("--bench"):
            item.add_marker(skip_bench)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", ",").split(",") if x]


def pytest_generate_tests(metafunc):
    """`flow` and `chunk` parametrize over the chosen backends and ramp, with readable ids."""
    cfg = metafunc.config
    if "flow_name" in metafunc.fixturenames:
        flows = selected_flows(cfg)
        metafunc.parametrize("flow_name", flows, ids=flows, scope="session")
    if "chunk" in metafunc.fixturenames:
        ramp = _ints(cfg.getoption("--ramp"))
        metafunc.parametrize("chunk", ramp, ids=[f"chunk{c}" for c in ramp], scope="session")


@pytest.fixture(scope="session")
def ramp(pytestconfig) -> list[int]:
    return sorted(_ints(pytestconfig.getoption("--ramp")))


@pytest.fixture(scope="session")
def context(pytestconfig) -> int:
    return pytestconfig.getoption("--context")


@pytest.fixture(scope="session")
def model_dir(pytestconfig, tmp_path_factory) -> str:
    """The checkpoint under test: --model, or a synthetic one of --preset (seed 0)."""
    model = pytestconfig.getoption("--model")
    if model:
        return model
    from c2w_export.model.synth import synth

    out = tmp_path_factory.mktemp(f"synth-{pytestconfig.getoption('--preset')}")
    synth(pytestconfig.getoption("--preset"), 0, out)
    return str(out)


@pytest.fixture(scope="session")
def preset_name(pytestconfig) -> str:
    return "custom" if pytestconfig.getoption("--model") else pytestconfig.getoption("--preset")


@pytest.fixture(scope="session")
def decoder(model_dir):
    from c2w_export import load_decoder

    return load_decoder(model_dir)


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory) -> str:
    from c2w_export.model.synth import synth

    out = tmp_path_factory.mktemp("synth-real")
    synth("real", 0, out)
    return str(out)


@pytest.fixture(scope="session")
def programs(decoder, ramp, context, tmp_path_factory) -> ProgramCache:
    return ProgramCache(decoder, ramp, context, tmp_path_factory.mktemp("programs"))


@pytest.fixture(scope="session")
def numerics_log():
    """Parity numbers collected during the run; written to reports/ at session end."""
    rows: list[dict] = []
    yield rows
    if rows:
        from c2w_export.report.parity import write_parity_reports

        write_parity_reports(rows, Path(__file__).resolve().parents[1] / "reports")
