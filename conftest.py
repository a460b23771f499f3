"""Repository-wide pytest set-up for this repo's own suite (fixtures stay in tests/conftest.py):

- the conformance plugin (c2w_export.conformance.plugin; `-p` in pyproject's addopts loads it
  even where entry-point plugins are disabled) and pytester, with which tests/ checks the plugin;
- the options: --model (path or hub id; default: a tiny synthetic checkpoint generated once per
  session), --preset (tiny|real, when no --model), --ramp, --context, --backends, --real (opt in to
  real-size tests), --bench (run benchmarks), --check-baseline, --save-baseline;
- the Hypothesis profiles: dev (default), ci (CI=true), fuzz (tox -e fuzz: 50x ci);
- one lowering cache per session (or one kept in --lower-cache DIR), and its log.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, Phase, settings

# Every example here runs a program, so a shrink phase can cost a failing run minutes per test (334 s
# for one StreamDecoder bug through one drawn test, with -x). ci and fuzz report the first failing
# example as drawn (derandomized: the same run draws it again; print_blob prints @reproduce_failure);
# dev keeps full shrinking for a minimal counterexample at the desk.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
settings.register_profile("dev", max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True, phases=NO_SHRINK,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("fuzz", parent=settings.get_profile("ci"), max_examples=50 * 20,  # tox -e fuzz: 50x ci,
                          phases=tuple(Phase))  # a counterexample of a reader is cheap to shrink, and read once
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser):
    from c2w_export.program.flows import FLOWS

    g = parser.getgroup("c2w-export")
    g.addoption("--model", default=None, help="model dir or hub id (default: tiny synthetic, generated)")
    g.addoption("--preset", default="tiny", choices=["tiny", "real"], help="synthetic preset when no --model")
    g.addoption("--ramp", default="1,2,4,8,16,25", help="comma-separated chunk sizes")
    g.addoption("--context", type=int, default=72, help="windowed left context frames")
    g.addoption("--backends", default=",".join(FLOWS), help="comma-separated flows to test")
    g.addoption("--real", action="store_true", help="also run real-size (slow) tests")
    g.addoption("--bench", action="store_true", help="run benchmarks (tests/bench)")
    g.addoption("--check-baseline", action="store_true",
                help="fail the run when a flow's max abs grew > 10x against reports/numerics-baseline.json (tox -e parity)")
    g.addoption("--lower-cache", metavar="DIR", default=None,
                help="keep lowered methods in DIR across sessions (content-addressed; opt-in, never in CI)")
    g.addoption("--arm64", metavar="DIR", default=None,
                help="run tests/test_arm64.py on the aarch64 runtime prepared in DIR (tox -e arm64 prepares it)")
    g.addoption("--save-baseline", action="store_true",
                help="write reports/numerics-baseline.json from this run (a complete run only)")


def pytest_configure(config):
    """One lowering cache per session (program/lowering.py), shared by the xdist workers and the CLI
    processes they start, so each distinct method program is lowered once; removed at the end, never
    reused by another session. `--lower-cache DIR` (or a C2W_LOWER_CACHE set by the caller) keeps one
    across sessions instead: opt-in, never in CI. Real-size runs (--real: the reference env;
    --preset real: bench-real) have none. Every lowering and cache hit of the session is logged
    (C2W_LOWER_LOG) for the time budget in reports/parity.md."""
    from c2w_export.program.lowering import CACHE_ENV, LOG_ENV

    if hasattr(config, "workerinput"):  # an xdist worker: the controller set both in the environment
        return
    config.c2w_session_dir = tempfile.mkdtemp(prefix="c2w-session-")
    os.environ["C2W_SESSION_DIR"] = config.c2w_session_dir  # tests/helpers.built_once: built once per session
    os.environ[LOG_ENV] = os.path.join(config.c2w_session_dir, "lowerings.jsonl")
    keep = config.getoption("--lower-cache", None)
    if keep:
        os.environ[CACHE_ENV] = os.path.abspath(keep)
    real = config.getoption("--real", False) or config.getoption("--preset", "tiny") == "real"
    if os.environ.get(CACHE_ENV) or real:
        # real-size runs lower each program once: a cache would only write 457 MB per method, and
        # serialize and recombine each lowered method in memory (bench-real: past 24 GiB)
        return
    config.c2w_lower_cache = os.path.join(config.c2w_session_dir, "lowered")
    os.environ[CACHE_ENV] = config.c2w_lower_cache


def pytest_unconfigure(config):
    from c2w_export.program.lowering import CACHE_ENV, LOG_ENV

    path = getattr(config, "c2w_session_dir", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(LOG_ENV, None)
        os.environ.pop("C2W_SESSION_DIR", None)
        if getattr(config, "c2w_lower_cache", None):
            os.environ.pop(CACHE_ENV, None)
