"""The one test-helper module: random codes, the initial state, the offline reference, the
--backends filter, case tables with readable ids, numerics-report rows, the session program cache, directories built once,
manifest edits and the Hypothesis strategies. Tests import this, never conftest."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import pytest
import torch
from hypothesis import strategies as st

from c2w_export.program.codes import random_codes
from c2w_export.program.compare import Diff
from c2w_export.program.flows import FLOWS
from c2w_export.program.variants import initial_state  # noqa: F401 (re-exported for tests)

ALL_FLOWS = tuple(FLOWS)  # every flow, in the registry's order (the --backends default)
# reduced-precision programs under test: id -> (flow, precision); each id is an xdist group of its own
PRECISION_FLOWS = {"xnnpack_fp16": ("executorch_xnnpack", "fp16"), "xnnpack_fp16_mixed": ("executorch_xnnpack", "fp16-mixed"),
                   "xnnpack_int8": ("executorch_xnnpack", "int8-tail"),
                   "xnnpack_int8_dynamic": ("executorch_xnnpack", "int8-dynamic")}


# ---------------------------------------------------------------- data
def codes(decoder, frames: int, seed: int) -> torch.Tensor:
    """Seeded uniform codes int64 [1, Q, frames] for `decoder`'s config."""
    cfg = decoder.config
    return random_codes(cfg.num_quantizers, frames, cfg.codebook_size, seed)


def offline(decoder, c: torch.Tensor) -> torch.Tensor:
    """The offline eager decode, [1, T*hop]."""
    with torch.no_grad():
        return decoder(c)[:, 0]


# ---------------------------------------------------------------- session directories
SESSION_ENV = "C2W_SESSION_DIR"  # set by the top-level conftest: one directory per session, shared by its workers


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(dir)` once per session, into a directory every xdist worker of the session shares
    (C2W_SESSION_DIR/built/<name>; the first worker to ask builds it under a file lock, the others
    wait and reuse it), so each distinct checkpoint and artifacts directory is made once per session.
    When C2W_ARTIFACT_CACHE is set (only by `tox -e mutation`), into that cache once and reused by
    every later session: under mutation the first session runs the unmutated code, so each mutant is
    judged against the checkpoint and the programs a team would ship, instead of paying a lowering
    per mutant. Outside a session directory: a fresh directory of this process."""
    import fcntl

    root = os.environ.get("C2W_ARTIFACT_CACHE") or (os.environ.get(SESSION_ENV) and
                                                    os.path.join(os.environ[SESSION_ENV], "built"))
    if not root:
        out = tmp_path_factory.mktemp(name)
        build(out)
        return out
    out = Path(root) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(root) / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when its process dies
        if not out.exists():
            partial = Path(root) / f".{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            build(partial)
            partial.rename(out)  # a build that died halfway is never reused
    return out


def exported(tmp_path_factory, model_dir: str, *args: str) -> Path:
    """The artifacts `c2w-export export --model model_dir *args` writes, exported once per session
    (built_once; the lowering cache shares their programs with every other test's) and shared by every
    test that asks for the same options. Read-only: a test that edits them edits a copy."""
    name = "export" + "".join(f"_{a.lstrip('-')}" for a in map(str, args))

    def build(out):
        rc, so, se = c2w("export", "--model", model_dir, "--out-dir", out / "artifacts", *args)
        assert rc == 0, se[-3000:] + so[-3000:]
        (out / "stdout.txt").write_text(so)  # beside the artifacts: what the export printed (test_cli reads it)
    return built_once(tmp_path_factory, name, build) / "artifacts"


def cli_in_process(argv: list[str]) -> tuple[int, str, str]:
    """The CLI's main() in this process -> (returncode, stdout, stderr); a crash is printed to
    stderr as a subprocess would show it (a traceback), with returncode 1."""
    import contextlib
    import io
    import traceback

    from c2w_export import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse usage errors
            rc = e.code if isinstance(e.code, int) else 2
        except Exception:
            traceback.print_exc()
            rc = 1
    return rc, out.getvalue(), err.getvalue()


def _clean_runner_loop(conn) -> None:
    """The clean runner's process: imports done, never runs ExecuTorch itself; each request (argv) is
    run by cli_in_process in a fork of it, and (rc, stdout, stderr) or the signal comes back."""
    import multiprocessing
    import signal

    # A daemon of the test process (so it dies with it), but what its forks run may lower in worker
    # processes (C2W_LOWER_WORKERS unset: `tox -e order`, a desk run), which multiprocessing refuses a
    # daemon's process: the forks are not daemons (each lowering worker dies with its parent, lowering.py).
    multiprocessing.current_process().daemon = False

    from c2w_export import cli  # noqa: F401 (imported once here, with the runtime: every fork starts with them)
    from c2w_export.program.flows import runtime
    from c2w_export.ship import decode, verify  # noqa: F401

    runtime()
    while True:
        request = conn.recv()
        if request is None:
            return
        if request[0] == "console":
            conn.send(_console_in_fork(*request[1:]))
            continue
        argv, env, before = request
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.environ.update(env)
            if before is not None:
                before()
            with os.fdopen(w, "w") as out:
                out.write(json.dumps(cli_in_process(argv)))
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as inp:
            text = inp.read()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            conn.send((-os.WTERMSIG(status), "", f"killed by {signal.Signals(os.WTERMSIG(status)).name}"))
        else:
            conn.send(tuple(json.loads(text)))


def _console_in_fork(argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> tuple[int, str, str]:
    """`python -m c2w_export *argv` as a subprocess runs it, in a fork of the clean runner (its imports
    done, ~5 s a process saves): its environment and directory, file descriptors 1 and 2 captured (the
    runtime's native output too), warnings ignored (c2w's PYTHONWARNINGS), an uncaught exception
    printed as a traceback with status 1, a signal as -signal, and killed past `timeout` seconds."""
    import signal
    import sys
    import tempfile
    import time
    import traceback
    import warnings

    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = open(1, "w", closefd=False, buffering=1)
            sys.stderr = open(2, "w", closefd=False, buffering=1)
            sys.argv = ["c2w-export", *argv]
            warnings.simplefilter("ignore")
            from c2w_export import cli

            try:
                rc = cli.main(argv) or 0
            except SystemExit as e:  # argparse's usage errors; a text, as Python reports it: printed, status 1
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except BaseException:
            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    deadline, status = time.monotonic() + timeout, None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
        else:
            time.sleep(0.02)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
        f.close()
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status), texts[0], texts[1] + f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return os.WEXITSTATUS(status), texts[0], texts[1]


class CleanRunner:
    """The CLI run in a fork of a process that has never run an ExecuTorch method (a fork of one that
    has hangs in the runtime, ship/probe.py), so every run gets the full child-process probe, and a
    run that kills its process (a crash the probe missed, or a kill on purpose) is reported as rc
    -signal instead of taking the test worker down. One process per CleanRunner, started by spawn
    (~4 s); each call sets `env` in its fork and calls `before()` there (a picklable function) first."""

    def __init__(self):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_clean_runner_loop, args=(child,), daemon=True)
        self.process.start()

    def __call__(self, argv: list[str], env: dict[str, str] | None = None, before=None) -> tuple[int, str, str]:
        self.conn.send(([str(a) for a in argv], dict(env or {}), before))
        return self.conn.recv()

    def console(self, argv: list[str], timeout: float = 900) -> tuple[int, str, str]:
        """The console entry on `argv` as a subprocess would run it (_console_in_fork), with this
        process's environment and directory now."""
        self.conn.send(("console", [str(a) for a in argv], {**os.environ, "PYTHONWARNINGS": "ignore"}, os.getcwd(),
                        timeout))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(30)


_CONSOLE: list = []  # this process's CleanRunner for c2w(), started on its first call


def c2w(*args, timeout=900):
    """Run the real console entry as a process of its own; returns (returncode, stdout, stderr).
    The process is a fork of this test process's clean runner (CleanRunner.console: a subprocess's
    environment, directory and captured output, without its ~5 s of imports). Under `tox -e mutation`
    (C2W_CLI_IN_PROCESS) it runs in this process instead, so mutmut sees which code each test
    reaches and the mutant under test is the one that runs."""
    if os.environ.get("C2W_CLI_IN_PROCESS"):
        return cli_in_process([str(a) for a in args])
    if not _CONSOLE or not _CONSOLE[0].process.is_alive():
        _CONSOLE[:] = [CleanRunner()]
    return _CONSOLE[0].console(list(args), timeout)


RAMP = ["2", "4"]  # the CLI artifacts' decode ramp (conftest: artifacts)


def manifest_edit(edit):
    """A function of an artifacts directory that applies `edit(manifest dict)` to its manifest.json
    (the manifest is not hashed, so tests edit it as an attacker or a broken tool would)."""
    def apply(root):
        path = root / "manifest.json"
        m = json.loads(path.read_text())
        edit(m)
        path.write_text(json.dumps(m))
    return apply


def rehash(root: Path, rel: str) -> None:
    """Record `rel`'s current bytes in root's manifest: the loosened manifest of a swapped or damaged
    file, so the runtime itself reads the bytes instead of the hash check refusing them."""
    import hashlib

    data = (root / rel).read_bytes()

    def edit(m):
        for p in m["programs"]:
            if p["path"] == rel:
                p["sha256"], p["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
            if p.get("bundle", {}).get("path") == rel:
                p["bundle"]["sha256"] = hashlib.sha256(data).hexdigest()
    manifest_edit(edit)(root)


# ---------------------------------------------------------------- selection and tables
def selected_flows(config) -> list[str]:
    return [f for f in config.getoption("--backends").split(",") if f]


def require_flow(config, flow: str) -> None:
    """Skip (with the reason shown) when the user filtered `flow` out with --backends."""
    if flow not in selected_flows(config):
        pytest.skip(f"{flow} not in --backends")


def cases(table: Sequence[tuple]) -> list:
    """[(id, *values)] -> pytest.param(*values, id=id)."""
    return [pytest.param(*row[1:], id=row[0]) for row in table]


def numerics_row(flow: str, variant: str, chunk: int | None, diff: Diff, stages: dict[str, Diff] | None = None,
                 reference: str | None = None) -> dict:
    """One row of reports/numerics.md; `reference` defaults to what a build compares the flow with."""
    reference = reference or ("fp64 decode" if flow.split()[0] == "eager" else "fp32 eager decoder")
    return {"flow": flow, "variant": variant, "chunk": chunk, "reference": reference, "max_abs": diff.max_abs,
            "snr_db": diff.snr_db, **({"stages": {s: d.max_abs for s, d in stages.items()}} if stages else {})}


# ---------------------------------------------------------------- programs
class ProgramCache:
    """Exports each (flow, variant, precision) once per session: one method for every chunk
    1..max_chunk, checked stage by stage against eager."""

    def __init__(self, decoder, max_chunk: int, context, root: Path, gate: str | None = None):
        self.decoder, self.max_chunk, self.context, self.root = decoder, max_chunk, context, root
        self.gate = gate  # tolerance key for every flow (the stress checkpoint's); default: the flow's
        self._built: dict = {}
        self._references: dict = {}

    def get(self, flow_name: str, variant: str, precision: str = "fp32"):
        """-> ({method: ProgramResult}, {method: Loaded})."""
        key = (flow_name, variant, precision)
        if key not in self._built:
            from c2w_export.program.flows import get_flow
            from c2w_export.program.pipeline import build
            from c2w_export.program.precision import with_precision

            flow = with_precision(get_flow(flow_name), precision)
            reason = flow.unavailable()
            if reason:  # a broken backend is a failure, never a silent skip
                pytest.fail(f"flow {flow_name} unavailable: {reason}")
            results, loaded = build(self.decoder, flow, [variant], self.max_chunk, self.context,
                                    self.root / f"{flow_name}-{precision}-{variant}", multi_method=True, windows=3,
                                    progress=lambda s: print(s, flush=True), gate=self.gate)
            self._built[key] = ({r.spec.method: r for r in results}, loaded)
        return self._built[key]

    def runner(self, flow_name: str, variant: str, precision: str = "fp32"):
        """A Dispatch over the (flow, variant) program: run(method, inputs) with input checks."""
        from c2w_export.program.runner import Dispatch, Runner

        results, loaded = self.get(flow_name, variant, precision)
        return Dispatch({m: Runner(flow_name, loaded[m], {m: r.spec}, self.decoder.config.codebook_size)
                         for m, r in results.items()})

    def chunk_diff(self, flow_name: str, variant: str, chunk: int, precision: str = "fp32", calls: int = 3,
                   quality: bool = False) -> Diff:
        """The loaded program on `calls` check calls of `chunk` frames (windows, or one stream's
        consecutive chunks) against what its build compared it with: the flow's reference decoder
        (fp64 for eager), or a reduced precision's own eager reference; with `quality`, the fp32
        eager decoder (a reduced precision's side 2)."""
        from c2w_export.program.flows import get_flow
        from c2w_export.program.pipeline import check_method, reference_decoder
        from c2w_export.program.variants import make_variant, parity_inputs

        results, _ = self.get(flow_name, variant, precision)
        r = results[variant]
        if quality:
            ref = make_variant(self.decoder, variant, self.max_chunk, self.context)
        elif r.own is not None:
            ref = r.own
        else:
            if flow_name not in self._references:
                self._references[flow_name] = reference_decoder(self.decoder, get_flow(flow_name))
            ref = make_variant(self._references[flow_name], variant, self.max_chunk, self.context)
        inputs = parity_inputs(r.module, calls, seed=chunk, chunk=chunk)
        return check_method(self.runner(flow_name, variant, precision).run, ref, variant, inputs, r.module.initial_state())


# ---------------------------------------------------------------- deliberate changes of prepare
def slice_tails(monkeypatch) -> None:
    """prepare's folded leaves with their state updates as plain slices again (the model's own,
    before LastFrames): the reference a state-update test compares with."""
    from c2w_export.model.decoder import Attention
    from c2w_export.model.layers import StatefulLeaf
    from c2w_export.program import prepare as pp

    for cls in (pp.FoldedCausalConv1d, pp.FoldedConvTranspose1d):
        monkeypatch.setattr(cls, "tail", StatefulLeaf.tail)
    monkeypatch.setattr(pp.FoldedAttention, "keep_cache", Attention.keep_cache)


# ---------------------------------------------------------------- Hypothesis strategies
from c2w_export.conformance.strategies import code_windows, patterns, seeds  # noqa: E402,F401  (re-exported)


def ramps(max_chunk: int = 25):
    """Ramp schedules: sorted distinct chunk sizes."""
    return st.lists(st.integers(1, max_chunk), min_size=1, max_size=5, unique=True).map(sorted)
