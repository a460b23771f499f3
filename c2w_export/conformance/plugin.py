"""The conformance checks of an artifacts directory as a pytest plugin (entry point `pytest11`).

    pytest --c2w-artifacts DIR [--c2w-model M] [--c2w-examples N] [--junitxml report.xml]
           [--c2w-arch aarch64 --c2w-arm64-runtime RUNTIME [--c2w-cpu cortex-a76|cortex-a72]]

runs conformance/suite.py: ship/checks.py's checks (the ones `c2w-export verify` runs), one test
per file, method, chunk and variant, with ids such as `test_windows[code2wav.pte::stateful::chunk=7]`.
Without paths on the command line it runs only them; with paths, them too. With --c2w-arch aarch64
every program call runs in ExecuTorch's aarch64 runtime under QEMU (c2w_export/arm64), side 1 is gated
for that CPU model's fp16 arithmetic, and every id starts with the arch (`aarch64-cortex-a76::...`). Without
--c2w-artifacts the plugin adds its options and nothing else. Nothing heavy is imported until then.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SUITE = Path(__file__).with_name("suite.py")
PROFILE = "c2w-conformance"  # the Hypothesis settings of the drawn checks
KEY = pytest.StashKey["Conformance"]()


def pytest_addoption(parser):
    g = parser.getgroup("c2w-conformance", "conformance of c2w-export artifacts (c2w_export.conformance)")
    g.addoption("--c2w-artifacts", metavar="DIR", default=None,
                help="artifacts directory (manifest.json) to run the conformance checks on")
    g.addoption("--c2w-model", metavar="M", default=None,
                help="checkpoint dir or hub id the artifacts are checked against (default: the manifest's model.id)")
    g.addoption("--c2w-examples", metavar="N", type=int, default=5,
                help="Hypothesis examples per drawn check (windows, upstream, irregular streams; default 5)")
    g.addoption("--c2w-arch", default="host", choices=["host", "aarch64"],
                help="where the programs run: this host (default), or ExecuTorch's aarch64 runtime under QEMU "
                     "(needs --c2w-arm64-runtime; .pte programs only)")
    g.addoption("--c2w-arm64-runtime", metavar="DIR", default=None,
                help="the aarch64 runtime prepared by `python -m c2w_export.arm64 prepare --root DIR`")
    g.addoption("--c2w-cpu", default="cortex-a76", help="the emulated CPU model with --c2w-arch aarch64 "
                "(cortex-a76: FP16 arithmetic, as on a current phone; cortex-a72: none)")
    g.addoption("--c2w-required", action="store_true",
                help="a usage error without --c2w-artifacts (tox -e conformance: never the whole suite by mistake)")


def pytest_configure(config):
    root = config.getoption("c2w_artifacts", None)
    if root is None:
        if config.getoption("c2w_required", False):
            raise pytest.UsageError("--c2w-artifacts DIR is required here (the artifacts directory to check)")
        return
    examples = config.getoption("c2w_examples")
    if examples < 1:
        raise pytest.UsageError(f"--c2w-examples must be >= 1, got {examples}")
    from hypothesis import HealthCheck, Phase, settings

    # no shrink phase: each example runs a program, and shrinking every failing check of a broken
    # program took minutes per check; the first failing example is reported as drawn (derandomized,
    # so a re-run draws it again)
    settings.register_profile(PROFILE, max_examples=examples, deadline=None, derandomize=True, database=None,
                              print_blob=True, phases=(Phase.explicit, Phase.generate),
                              suppress_health_check=list(HealthCheck))
    config.addinivalue_line("markers", "c2w_absent: a conformance test with no instance (deselected)")
    config.stash[KEY] = Conformance(root, config.getoption("c2w_model"), arch_session(config))
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.append(str(SUITE))
    else:  # testpaths or the current directory: the conformance checks only
        config.args[:] = [str(SUITE)]


def arch_session(config):
    """--c2w-arch aarch64: the arm64.session.Session its programs run in (UsageError naming what is
    missing); host: None."""
    if config.getoption("c2w_arch") == "host":
        return None
    from ..arm64.runtime import CPUS, Unavailable
    from ..arm64.session import Session

    root, cpu = config.getoption("c2w_arm64_runtime"), config.getoption("c2w_cpu")
    if not root:
        raise pytest.UsageError("--c2w-arch aarch64 needs --c2w-arm64-runtime DIR (prepare it with "
                                "`python -m c2w_export.arm64 prepare --root DIR`)")
    if cpu not in CPUS:
        raise pytest.UsageError(f"--c2w-cpu {cpu!r} is not an emulated CPU model; choose from {sorted(CPUS)}")
    try:
        return Session(root, cpu)
    except Unavailable as e:
        raise pytest.UsageError(str(e)) from None


def pytest_unconfigure(config):
    c = config.stash.get(KEY, None)
    if c is not None and c.session is not None:
        c.session.close()


def pytest_report_header(config):
    c = config.stash.get(KEY, None)
    if c is None:
        return None
    return [f"c2w conformance: {c.root} against {c.model or 'the manifest model.id'}; {c.describe()}"]


class Conformance:
    """The artifacts directory under check: its Subject (ship/checks.py), or why there is none
    (an unreadable manifest: then only test_manifest is collected, and it fails with the reason)."""

    def __init__(self, root: str, model: str | None, session=None):
        from ..ship.checks import Subject

        self.root, self.model, self.session = Path(root), model, session
        # where the programs run off the host ("aarch64-cortex-a76"), leading every test id (and the JUnit XML);
        # None: on this host, and the ids stay as they are
        self.arch = session.arch if session is not None else None
        try:
            if session is None:
                self.subject, self.error = Subject(root, model), None
            else:
                from ..arm64.runtime import CPUS
                from ..arm64.session import on_arm

                arithmetic = CPUS[session.cpu].arithmetic
                self.subject, self.error = Subject(root, model, on_arm(session), f"{session.cpu} (aarch64, QEMU)",
                                                   arithmetic), None
        except Exception as e:  # noqa: BLE001 -- ManifestError, ArtifactError, OSError: reported by test_manifest
            self.subject, self.error = None, f"{type(e).__name__}: {e}"
        self._oracle = None

    def describe(self) -> str:
        if self.subject is None:
            return "manifest unreadable"
        return (f"{len(self.subject.art.specs)} method(s) in {len(self.subject.art.files())} file(s); CPU "
                f"{self.subject.cpu}; programs run on {self.arch or 'this host'}")

    def targets(self, test: str) -> list[tuple[str, tuple]]:
        """(id, target) of each instance of conformance test `test` (suite.py), the id led by the arch."""
        return [(f"{self.arch}::{i}" if self.arch else i, t) for i, t in self._targets(test)]

    def _targets(self, test: str) -> list[tuple[str, tuple]]:
        if test == "test_manifest":
            return [("manifest.json", ())]
        s = self.subject
        if s is None:
            return []
        specs, d = s.art.specs, s.manifest["decode"]
        methods = [(f"{s.art.file_of(m)}::{m}", (s.art.file_of(m), m)) for m in specs]
        if test == "test_file":
            return [(rel, (rel,)) for rel in s.art.named_files()]
        if test == "test_model":
            return [(Path(self.model or s.manifest["model"]["id"]).name or "model", ())]
        if test == "test_methods":
            return [(rel, (rel,)) for rel in s.art.files()]
        if test in ("test_contract", "test_upstream"):
            return methods
        if test == "test_windows":
            return [(f"{label}::chunk={n}", (*target, n)) for label, target in methods
                    for n in chunks(d["ramp"], specs[target[1]].min_chunk, specs[target[1]].max_chunk)]
        if test == "test_bundle":
            return [(f"{p['bundle']['path']}::{p['method']}", (p["bundle"]["path"], p["method"]))
                    for p in s.manifest["programs"] if "bundle" in p]
        if test in ("test_stream", "test_stream_irregular"):
            return [(v, (v,)) for v in d["variants"]]
        raise KeyError(test)

    def oracle(self):
        """Upstream qwen-tts on the checkpoint (conformance/upstream.py); ImportError when not installed."""
        if self._oracle is None:
            from .upstream import Oracle

            self._oracle = Oracle(self.subject.decoder)
        return self._oracle


def _rename(item, nodeid: str) -> None:
    """Set an item's node id; pytest has no public setter (9.x keeps a parsed NodeId in `_id`,
    earlier versions the string in `_nodeid`). Every xdist worker renames alike."""
    try:
        from _pytest.nodes import NodeId

        item._id = NodeId.parse(nodeid)  # noqa: SLF001
    except ImportError:
        item._nodeid = nodeid  # noqa: SLF001


def chunks(ramp, lo: int, hi: int) -> list[int]:
    """The chunk sizes a method is checked at: both ends of its range and every ramp size."""
    return sorted({lo, hi, *(r for r in ramp if lo <= r <= hi)})


NODE_PREFIX = "c2w_conformance.py::"  # the suite's node ids (JUnit classname c2w_conformance), wherever it is installed


def pytest_collection_modifyitems(config, items):
    """Name the suite's tests `c2w_conformance.py::test_...[...]` (its path lies outside the caller's
    rootdir, which would leave an empty node id prefix and JUnit classname); drop those that have no
    instance (an unreadable manifest): not skipped, absent."""
    if KEY not in config.stash:
        return
    arch = config.stash[KEY].arch
    for item in items:
        if item.path == SUITE:
            _rename(item, NODE_PREFIX + item.name)
            if arch:
                item.user_properties.append(("arch", arch))  # a <property> of the test case in the JUnit XML
    absent = [i for i in items if i.get_closest_marker("c2w_absent")]
    if absent:
        config.hook.pytest_deselected(items=absent)
        items[:] = [i for i in items if not i.get_closest_marker("c2w_absent")]
