"""The conformance tests of one artifacts directory (collected by plugin.py with --c2w-artifacts).

Each test runs one of ship/checks.py's checks, the ones `c2w-export verify` runs, at the tolerances
of the installed table, and fails with the check's one-line reason:

- per file: test_file (size and sha256 against the manifest, inside the directory);
- the manifest and the model: test_manifest (schema, self-consistency; absent records warn),
  test_model (the checkpoint is the one the artifacts were built from);
- per program file: test_methods (it holds exactly the methods the manifest names);
- per method: test_contract (the published I/O against the checkpoint's and the program's own
  metadata, the recorded tolerance), test_windows (drawn code windows and histories at each checked
  chunk size, against eager; a reduced precision on both gate sides), test_upstream (drawn, against
  upstream qwen-tts, when it is installed), test_bundle (the bundled vectors, in the runtime);
- per variant: test_stream (a whole stream in the manifest's ramp), test_stream_irregular (drawn
  chunk sequences).

A check whose program cannot run (its file damaged, its contract broken) fails, naming why.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis.errors import HypothesisException
from hypothesis import strategies as st

from ..program.streaming import stream_frames
from ..ship.checks import (NotChecked, Row, arithmetic_rows, contract_problems, method_rows, model_row,
                           record_rows, stream_rows, tolerance_rows, upstream_rows, window_rows)
from .plugin import KEY, PROFILE
from .strategies import code_windows

DRAWN = settings(settings.get_profile(PROFILE))


class RecordAbsent(UserWarning):
    """A record-only manifest field is absent (nothing reads it)."""


def pytest_generate_tests(metafunc):
    targets = metafunc.config.stash[KEY].targets(metafunc.function.__name__)
    if not targets:
        metafunc.parametrize("target", [pytest.param(None, marks=pytest.mark.c2w_absent)], ids=["absent"])
        return
    metafunc.parametrize("target", [t for _, t in targets], ids=[i for i, _ in targets])


@pytest.fixture(scope="session")
def conformance(pytestconfig):
    return pytestconfig.stash[KEY]


@pytest.fixture(scope="session")
def subject(conformance):
    return conformance.subject


@contextlib.contextmanager
def reasons():
    """Any error of a check (a damaged file, a runtime failure, a contract problem) as a failure
    with its one-line reason instead of a traceback."""
    try:
        yield
    except HypothesisException:
        raise
    except NotChecked as e:
        pytest.fail(str(e), pytrace=False)
    except Exception as e:  # noqa: BLE001 -- every error of the code under check is a verdict
        pytest.fail(f"{type(e).__name__}: {e}", pytrace=False)


@pytest.fixture
def runnable(request, subject, target):
    """Before a drawn check's examples: fails it once, naming why, unless each method it runs can be
    checked (its program file opens and its contract holds)."""
    name = request.function.__name__
    if name.startswith("test_stream"):
        methods = [p["method"] for p in subject.manifest["programs"] if p["variant"] == target[0]]
    else:
        methods = [target[1]]
    with reasons():
        for method in methods:
            ready(subject, method)


def passed(rows: list[Row]) -> None:
    bad = [r for r in rows if not r.passed]
    if bad:
        pytest.fail("; ".join(f"{r.check} {r.target}: {r.detail}" for r in bad), pytrace=False)


def ready(s, method: str) -> None:
    """NotChecked unless `method`'s program can be checked: its file opens and its contract holds."""
    problems = contract_problems(s, method)
    if not problems:
        problems = s.program_problems(method)
    if problems:
        raise NotChecked(f"not run: the published contract of {method} does not hold: {problems[0]}")


# ---------------------------------------------------------------- the manifest, the model, the files
def test_manifest(conformance, target):
    if conformance.error:
        pytest.fail(conformance.error, pytrace=False)
    for r in record_rows(conformance.subject):
        warnings.warn(RecordAbsent(f"{r.target}: {r.detail}"))


def test_model(subject, target):
    with reasons():
        passed([model_row(subject)])


def test_file(subject, target):
    (rel,) = target
    problems = subject.file_problems(rel)
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


def test_methods(subject, target):
    (rel,) = target
    with reasons():
        passed(method_rows(subject, rel))


# ---------------------------------------------------------------- per method
def test_contract(subject, target):
    _, method = target
    with reasons():
        problems = contract_problems(subject, method) + subject.program_problems(method)
        if problems:
            pytest.fail("; ".join(problems), pytrace=False)
        passed(tolerance_rows(subject, method) + arithmetic_rows(subject))


@DRAWN
@given(data=st.data())
def test_windows(subject, target, runnable, data):
    _, method, chunk = target
    with reasons():
        passed(window_rows(subject, method, _calls(subject, method, chunk, data), f"chunk {chunk}"))


@DRAWN
@given(data=st.data())
def test_upstream(conformance, subject, target, runnable, data):
    _, method = target
    try:
        oracle = conformance.oracle()
    except ImportError as e:
        pytest.skip(f"upstream not compared: {e}")
    spec = subject.art.specs[method]
    chunk = data.draw(st.integers(spec.min_chunk, spec.max_chunk), label="chunk")
    with reasons():
        passed(upstream_rows(subject, oracle, method, _calls(subject, method, chunk, data), f"chunk {chunk}"))


def test_bundle(conformance, subject, target):
    rel, method = target
    if conformance.arch:
        pytest.skip(f"bundled vectors run in this host's runtime (ExecuTorch's bundled-program API), not on "
                    f"{conformance.arch}: a run without --c2w-arch checks them")
    problems = subject.file_problems(rel)
    if problems:
        pytest.fail(f"not run: {'; '.join(problems)}", pytrace=False)
    with reasons():
        passed([r for r in subject.bundles if r.target == method] or
               [Row("bundle", method, None, None, False, "no result from the bundled-program API")])


def _calls(s, method: str, chunk: int, data) -> list[tuple[torch.Tensor, ...]]:
    """Drawn inputs of one check at `chunk` frames: a windowed window with a drawn history
    (0..context real frames); a stateful chunk after 0-2 drawn chunks of the same stream."""
    spec, cfg = s.art.specs[method], s.manifest["decode"]
    q, size = cfg["num_quantizers"], cfg["codebook_size"]
    if spec.variant == "windowed":
        c = data.draw(code_windows(q, spec.context + chunk, size), label="codes")
        h = data.draw(st.integers(0, spec.context), label="history")
        return [(c, torch.tensor([h], dtype=torch.int64))]
    before = data.draw(st.lists(st.integers(spec.min_chunk, spec.max_chunk), max_size=2), label="chunks before")
    return [(data.draw(code_windows(q, n, size), label=f"codes ({n} frames)"),) for n in [*before, chunk]]


# ---------------------------------------------------------------- per variant
def test_stream(subject, target, runnable):
    (variant,) = target
    d = subject.manifest["decode"]
    with reasons():
        frames = stream_frames(d["ramp"], 5, d["context_frames"] if variant == "windowed" else 0)
        passed(stream_rows(subject, frames, 1235, variants=[variant]))


@DRAWN
@given(data=st.data())
def test_stream_irregular(subject, target, runnable, data):
    (variant,) = target
    d = subject.manifest["decode"]
    spec = next(subject.art.specs[p["method"]] for p in subject.manifest["programs"] if p["variant"] == variant)
    sizes = st.integers(spec.min_chunk, spec.max_chunk)
    calls = data.draw(st.lists(sizes, min_size=2, max_size=8), label="chunk sizes")
    while variant == "windowed" and sum(calls) <= d["context_frames"]:  # past the context: a steady state too
        calls.append(data.draw(sizes, label="more chunk sizes"))
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    with reasons():
        passed(stream_rows(subject, sum(calls), seed, calls, [variant]))
