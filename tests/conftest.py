"""The suite's fixtures and session caches, its xdist scheduling and its end-of-session reports.
The options and the Hypothesis profiles are repository-wide: the top-level conftest.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from c2w_export.arm64.runtime import CPUS
from helpers import ALL_FLOWS, PRECISION_FLOWS, RAMP, ProgramCache, built_once, exported, selected_flows

def pytest_collection_modifyitems(config, items):
    skip_real = pytest.mark.skip(reason="real-size test: opt in with --real (the reference env and tox -e real do)")
    skip_bench = pytest.mark.skip(reason="benchmark: run with --bench (tox -e bench)")
    for item in items:
        if item.get_closest_marker("real") and not config.getoption("--real"):
            item.add_marker(skip_real)
        if item.get_closest_marker("bench") and not config.getoption("--bench"):
            item.add_marker(skip_bench)
    budget = os.environ.get("C2W_MUTATION_BUDGET_S")
    if budget and Path("mutmut-stats.json").exists() and not config.option.collectonly:  # mutmut lists tests with --collect-only
        fastest_first(config, items, float(budget))


SAME_WORKER_AS = {"test_multi_method_pte_shares_weights": "executorch_xnnpack"}  # reads that flow's session program


def flow_group(nodeid: str) -> str:
    """The xdist work unit of a test: the flow in its parameter ids (so each flow's programs are
    lowered on one worker, once), else the test alone."""
    name, _, ids = nodeid.partition("[")
    cpus = [c for c in CPUS if c in ids]  # tests/test_arm64.py: one aarch64 process per CPU model, on one worker
    if cpus:
        return f"arm64-{cpus[0]}"
    flows = [t for t in ids.rstrip("]").split("-") if t in ALL_FLOWS or t in PRECISION_FLOWS]
    return flows[0] if flows else SAME_WORKER_AS.get(name.rpartition("::")[2], nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` by flow_group. (xdist's own loadgroup renames each grouped node id, which
    pytest 9 no longer allows, so its xdist_group marks silently group nothing.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FlowGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return flow_group(nodeid)

    return FlowGroups(config, log)


def fastest_first(config, items, budget_s: float) -> None:
    """Under `tox -e mutation` (mutmut runs a mutant's covering tests with -x, from mutants/): run
    them fastest first by the durations mutmut measured on the unmutated code, so a kill costs
    the cheapest test that sees it, and stop adding tests past `budget_s` seconds of them. A mutant
    that survives the budget counts as survived, so the published score is a lower bound.

    A test marked `mutation_first("<glob over mutant names>")` asserts a function's whole output by
    hand: for that function's mutants it runs first and outside the budget (cheap tests that run
    the function without reading its labels would otherwise spend the budget before it)."""
    import fnmatch
    import json

    mutant = os.environ.get("MUTANT_UNDER_TEST", "")

    def first(item) -> bool:
        mark = item.get_closest_marker("mutation_first")
        return mark is not None and fnmatch.fnmatchcase(mutant, mark.args[0])

    took = json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]
    lead = [i for i in items if first(i)]
    rest = sorted((i for i in items if not first(i)), key=lambda i: took.get(i.nodeid, 0.0))
    total = 0.0
    for n, item in enumerate(rest):
        total += took.get(item.nodeid, 0.0)
        if total > budget_s and (n > 0 or lead):
            config.hook.pytest_deselected(items=rest[n:])
            del rest[n:]
            break
    items[:] = lead + rest


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

    preset = pytestconfig.getoption("--preset")
    return str(built_once(tmp_path_factory, f"synth-{preset}", lambda out: synth(preset, 0, out)))


@pytest.fixture(scope="session")
def preset_name(pytestconfig) -> str:
    return "custom" if pytestconfig.getoption("--model") else pytestconfig.getoption("--preset")


@pytest.fixture(scope="session")
def decoder(model_dir):
    from c2w_export import load_decoder

    return load_decoder(model_dir)


@pytest.fixture(scope="session")
def stress_decoder():
    """The combined stress checkpoint (tiny, seed 0): the golden set tiny_stress_seed0's decoder."""
    from c2w_export.report.golden import golden_decoder

    return golden_decoder("tiny_stress_seed0")


@pytest.fixture(scope="session")
def stress_programs(stress_decoder, ramp, context, tmp_path_factory) -> ProgramCache:
    """Stress-checkpoint programs (chunks 1..the ramp's largest), every flow."""
    return ProgramCache(stress_decoder, max(ramp), context, tmp_path_factory.mktemp("stress-programs"), gate="stress")


@pytest.fixture(scope="session")
def oracle(decoder):
    """The upstream decoder on the session checkpoint: part of the gate, so missing is a failure."""
    from c2w_export.conformance.upstream import Oracle

    try:
        return Oracle(decoder)
    except ImportError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory) -> str:
    from c2w_export.model.synth import synth

    out = tmp_path_factory.mktemp("synth-real")
    synth("real", 0, out)
    return str(out)


@pytest.fixture(scope="session")
def programs(decoder, ramp, context, tmp_path_factory) -> ProgramCache:
    return ProgramCache(decoder, max(ramp), context, tmp_path_factory.mktemp("programs"))


ROWS: list[dict] = []  # numerics rows of this session (helpers.numerics_row)
REPORTS = Path(__file__).resolve().parents[1] / "reports"
ROW_MODULES = ("test_parity.py", "test_streaming.py", "test_golden.py", "test_precision.py")  # the tests that log rows
DESELECTED: list = []
WORKERS: list[dict] = []  # under xdist, what each worker ran: {"deselected": n, "files": [...]}


@pytest.fixture(scope="session")
def numerics_log():
    """Parity numbers collected during the run; reports/ is written at session end, by a complete run only."""
    return ROWS


def pytest_deselected(items):
    DESELECTED.extend(items)


DURATIONS: dict[str, float] = {}  # node id -> seconds of setup + call + teardown (the controller's view)
STARTED: list[float] = []


def pytest_sessionstart(session):
    import time

    STARTED.append(time.monotonic())


def pytest_runtest_logreport(report):
    DURATIONS[report.nodeid] = DURATIONS.get(report.nodeid, 0.0) + report.duration


def time_budget(config) -> dict:
    """Where this session's time went: seconds per test file, the lowerings the session did (with
    cache hits and discarded entries, from C2W_LOWER_LOG) and the slowest tests."""
    import json
    import time

    from c2w_export.program.lowering import LOG_ENV

    events = []
    log = os.environ.get(LOG_ENV)
    if log and os.path.exists(log):
        events = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    lowered = [e for e in events if e["event"] == "lowered"]
    by_test: dict[str, list] = {}  # the test a lowering happened in -> [methods, seconds]
    for e in lowered:
        row = by_test.setdefault(e.get("test") or "(outside a test)", [[], 0.0])
        row[0].append(f"{e.get('method', '?')} ({e.get('partitioner', '?')})")
        row[1] += e["seconds"]
    files: dict[str, float] = {}
    for nodeid, s in DURATIONS.items():
        f = nodeid.split("::")[0]
        files[f] = files.get(f, 0.0) + s
    return {"wall_s": time.monotonic() - STARTED[0] if STARTED else None,
            "workers": getattr(config.option, "numprocesses", None) or 0,
            "test_s": sum(DURATIONS.values()), "files": files,
            "slowest": sorted(DURATIONS.items(), key=lambda kv: -kv[1])[:10],
            "lowered": len(lowered), "distinct": len({e["key"] for e in lowered}),
            "lowering_s": sum(e["seconds"] for e in lowered), "hits": sum(e["event"] == "hit" for e in events),
            "discarded": sum(e["event"] == "discarded" for e in events),
            "by_test": {k: (sorted(v[0]), v[1]) for k, v in by_test.items()}}


def partial_reason(session, exitstatus) -> str | None:
    """Why this run must not rewrite the committed reports (None: a complete run of its matrix).
    The parity matrix is everything with default options; the real matrix is `--real -m real`."""
    opt = session.config.option
    get = session.config.getoption
    real = get("--real") and opt.markexpr == "real"
    if exitstatus != 0 or session.testsfailed:
        return "a test failed"
    if opt.keyword or (opt.markexpr and not real):
        return "-k / -m filtered the tests"
    if opt.maxfail:
        return "-x / --maxfail"
    if DESELECTED or any(w["deselected"] for w in WORKERS) or getattr(opt, "lf", False) or getattr(opt, "failedfirst", False):
        return "tests were deselected"
    defaults = {"--backends": ",".join(ALL_FLOWS), "--ramp": "1,2,4,8,16,25", "--context": 72, "--model": None, "--preset": "tiny"}
    changed = [k for k, v in defaults.items() if get(k) != v]
    if changed:
        return f"non-default {', '.join(changed)}"
    files = {Path(str(i.fspath)).name for i in session.items}.union(*(w["files"] for w in WORKERS))
    missing = [m for m in ROW_MODULES if m not in files] if not real else []
    if missing:
        return f"only part of the suite ran (not {', '.join(missing)})"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: gather a finished worker's numerics rows and what it ran."""
    import json

    out = json.loads(getattr(node, "workeroutput", {}).get("c2w", "null") or "null")
    if out is None:  # a worker that crashed sent nothing: the run is partial
        WORKERS.append({"deselected": 1, "files": []})
        return
    ROWS.extend(out["rows"])
    WORKERS.append({"deselected": out["deselected"], "files": out["files"]})


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller writes the reports
        import json

        session.config.workeroutput["c2w"] = json.dumps({
            "rows": ROWS, "deselected": len(DESELECTED),
            "files": sorted({Path(str(i.fspath)).name for i in session.items})})
        # Collect the worker's garbage now and freeze what is left: after this hook the worker reports it
        # finished, xdist gives its shutdown 5 s before it sends the worker a SIGINT, and pytest's own
        # unconfigure runs a full gc.collect() over the session's heap, which took longer once (a
        # KeyboardInterrupt printed from inside a gc callback in a green run's log).
        import gc

        gc.collect()
        gc.freeze()
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.ensure_newline()
    say = reporter.write_line if reporter else print
    arm = [r for r in ROWS if r.get("arm64")]  # tests/test_arm64.py: its own report
    ROWS[:] = [r for r in ROWS if not r.get("arm64")]
    if arm:
        write_arm64_report(session, arm, say)
    if not ROWS or not hasattr(session.config.option, "markexpr"):
        return
    from c2w_export.report import parity as pr

    real = all(r["flow"].endswith("(real)") for r in ROWS)
    suffix = "-real" if real else ""
    baseline_path = REPORTS / f"numerics-baseline{suffix}.json"
    baseline = pr.load_baseline(baseline_path)
    if session.config.getoption("--check-baseline"):
        bad = pr.regressions(ROWS, baseline)
        if baseline is None:
            say(f"numerics baseline: none at {baseline_path}; nothing to compare")
        for line in bad:
            say(f"numerics regression: {line}")
        if bad and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    why = partial_reason(session, session.exitstatus)
    if why:
        say(f"reports/ not rewritten: partial run ({why})")
        return
    pr.write_parity_reports(ROWS, REPORTS, suffix, "real" if real else "tiny", baseline, time_budget(session.config))
    say(f"wrote reports/parity{suffix}.md and reports/numerics{suffix}.md ({len(ROWS)} rows)")
    if session.config.getoption("--save-baseline"):
        pr.save_baseline(ROWS, baseline_path)
        say(f"wrote {baseline_path.relative_to(REPORTS.parent)}: review its diff like code")


def write_arm64_report(session, rows, say) -> None:
    """reports/arm64.md from a complete arm64 run: every case of tests/test_arm64.py passed, nothing filtered."""
    import platform

    from c2w_export.arm64.runtime import ready
    from c2w_export.report import arm64
    from test_arm64 import ARM_CASES

    opt = session.config.option
    why = ("a test failed" if session.exitstatus != 0 or session.testsfailed else
           "-k / -m / -x filtered the tests" if opt.keyword or opt.markexpr or opt.maxfail else
           f"{len(rows)} of {len(ARM_CASES)} programs ran" if len(rows) != len(ARM_CASES) else None)
    if why:
        say(f"reports/arm64.md not rewritten: partial run ({why})")
        return
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    arm64.write(rows, REPORTS / "arm64.md", ready(session.config.getoption("--arm64")), cpu)
    say(f"wrote reports/arm64.md ({len(rows)} rows)")


# ---------------------------------------------------------------- shipped artifacts (test_cli, test_contract)
@pytest.fixture(scope="session")
def artifacts(model_dir, tmp_path_factory):
    """torch_export artifacts, both variants, chunks 1..4, ramp 2 4: exported once per session by the CLI."""
    return exported(tmp_path_factory, model_dir, "--ramp", *RAMP, "--max-chunk", "4", "--backend", "torch_export",
                    "--variant", "both")


@pytest.fixture(scope="session")
def et_artifacts(model_dir, tmp_path_factory):
    """XNNPACK, one multi-method .pte holding both variants (chunks 1..25), with bundled vectors:
    exported once per session by the CLI."""
    return exported(tmp_path_factory, model_dir, "--ramp", "2", "--variant", "both", "--multi-method", "--bundle")


@pytest.fixture(scope="session")
def precision_artifacts(model_dir, tmp_path_factory):
    """precision -> XNNPACK artifacts at that precision (both variants in one .pte, chunks 1..25,
    ramp 1, bundles), exported once per session by the CLI: its methods are the ones test_precision's
    own builds lower (the lowering cache)."""
    def get(precision: str):
        return exported(tmp_path_factory, model_dir, "--ramp", "1", "--variant", "both", "--multi-method", "--bundle",
                        "--precision", precision)
    return get


@pytest.fixture
def copy_of(tmp_path):
    def make(src):
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst
    return make
