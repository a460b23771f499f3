"""Lowering to one ExecuTorch program, a method at a time.

Each method's ExportedProgram is lowered on its own (`to_edge_transform_and_lower`, or `to_edge`
for portable kernels) in parallel worker processes when more than one method needs it, more
than one core is free and memory holds the workers (a worker dies with its parent); else all of
them in one call in this process. A lowered method travels
between processes (and into the cache) as exir serde bytes, and the methods are combined into one
multi-method program (XNNPACK names each weight by the hash of its
bytes, so methods still share them). The result is the same .pte, byte for byte, as lowering every
method in one call (tests/test_lowering.py). Before partitioning, what depends on constants
alone is computed once and stored (fold_constants).

With C2W_LOWER_CACHE naming a directory, a method whose exported program (graph, shapes, metadata,
weights) was lowered before with the same partitioner, lowering code and versions, by any process
sharing that directory, is not lowered again. The test suite sets it to a directory that lives for
one session (tests/conftest.py), so the many tests that export the same tiny programs lower each
once; `pytest --lower-cache DIR` keeps one across sessions (opt-in, never in CI). Each entry
carries the sha256 of its bytes: an entry that does not match, or does not load, is discarded and
the method lowered again, never trusted. With C2W_LOWER_LOG naming a file, every method lowered
or read back appends one JSON line to it (the suite's time budget in reports/parity.md).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process  # BrokenProcessPool (not loaded by `import concurrent.futures` alone)
import contextlib
import functools
import hashlib
import io
import multiprocessing
import os
import pickle
import time
import weakref
from typing import Callable, Mapping

import torch

from ..fileio import atomic_write
from .casts import back_to_copies, register as register_casts, to_float_casts  # also registers c2w::float_cast
from .fp16_weights import register as register_fp16_weights

CACHE_ENV = "C2W_LOWER_CACHE"  # a directory shared by the processes of one test session
LOG_ENV = "C2W_LOWER_LOG"  # a file: one JSON line per method lowered or read from the cache
WORKERS_ENV = "C2W_LOWER_WORKERS"  # worker processes; default: the cores this process may use
_NAME = "method"  # the name a lone method is lowered under (a method's name does not change its lowering)


def _xnnpack_partitioners() -> list:
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    from .partition import capped_xnnpack_partitioner

    # no partition over half the weights (a lower load peak); float casts delegated (program/casts.py);
    # float16 conv weights stored as float16 (program/fp16_weights.py)
    register_fp16_weights()
    return [capped_xnnpack_partitioner(configs=[*ALL_PARTITIONER_CONFIGS, *register_casts()])]


# partitioner name -> the partitioners to lower with; "portable" delegates nothing (portable kernels)
PARTITIONERS: dict[str, Callable[[], list]] = {"xnnpack": _xnnpack_partitioners, "portable": lambda: []}


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# Memory a worker needs, per byte of the program it lowers. Measured at real size (a 457 MB windowed
# method): 5.2 GB resident per worker, ~11.4x. Two such workers beside a test session's parent
# (15.7 GB) ran a 24 GiB machine out of memory (tox -e bench-real, 2026-12-04).
WORKER_BYTES_PER_PROGRAM_BYTE = 12
# What the parent adds per lowered method it gathers (its serde bytes, then the combined program).
PARENT_BYTES_PER_PROGRAM_BYTE = 2


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def program_bytes(ep) -> int:
    """Bytes of an ExportedProgram's weights and constants (what lowering copies)."""
    return sum(t.numel() * t.element_size() for t in {**ep.state_dict, **ep.constants}.values()
               if isinstance(t, torch.Tensor))


def workers_for(misses: int, size: int = 0, available: int | None = None) -> int:
    """Worker processes for `misses` methods of up to `size` weight bytes each: C2W_LOWER_WORKERS,
    else the free cores, as many as `available` bytes of memory (default: MemAvailable) hold beside
    what the parent gathers. 1 means: lower in this process."""
    want = os.environ.get(WORKERS_ENV)
    if want is not None:
        try:
            n = int(want)
        except ValueError:
            raise ValueError(f"{WORKERS_ENV} must be an integer, got {want!r}") from None
        if n < 1:
            raise ValueError(f"{WORKERS_ENV} must be >= 1, got {n}")
        return max(1, min(n, misses))
    n = min(cores(), misses)
    if size and available is None:
        available = available_memory()
    if size and available is not None:
        spare = available - misses * size * PARENT_BYTES_PER_PROGRAM_BYTE
        n = min(n, spare // (size * WORKER_BYTES_PER_PROGRAM_BYTE))
    return max(1, n)


def _die_with_parent() -> None:
    """Worker initializer: the kernel kills this worker when its parent dies (Linux), so a killed
    run (OOM, ^C, a CI timeout) leaves no orphan holding gigabytes."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux/glibc: orphans end when their task queue closes
        pass


def worker_pool(n: int) -> concurrent.futures.ProcessPoolExecutor:
    """`n` spawned lowering workers (spawn: no copy of the parent's gigabytes), each dying with its parent."""
    return concurrent.futures.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_die_with_parent)


LOWERING_CODE = ("lowering.py", "partition.py", "casts.py", "fp16_weights.py")  # this package's code that runs inside a lowering


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """sha256 of the sources of LOWERING_CODE: a cache kept across sessions (--lower-cache) never
    serves a lowering that an edit of the pass or the partitioner would change."""
    h = hashlib.sha256()
    for name in LOWERING_CODE:
        with open(os.path.join(os.path.dirname(__file__), name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def program_key(ep, partitioner: str) -> str:
    """sha256 over what lowering reads: every node (op, target, arguments, output shape and dtype,
    the source module and function it came from), the signature, the dynamic dims' ranges, every weight's bytes, the
    partitioner, the code that lowers (code_digest) and the torch/ExecuTorch versions."""
    from ..env import versions

    h = hashlib.sha256(repr((partitioner, code_digest(), versions()["torch"], versions()["executorch"])).encode())
    for n in ep.graph.nodes:
        val = n.meta.get("val")
        shape = (tuple(val.shape), str(val.dtype)) if isinstance(val, torch.Tensor) else repr(val)
        h.update(repr((n.op, n.name, str(n.target), n.args, n.kwargs, shape, n.meta.get("nn_module_stack"),
                       n.meta.get("source_fn_stack"), n.meta.get("torch_fn"))).encode())
    h.update(str(ep.graph_signature).encode())
    h.update(repr(sorted((str(k), str(v)) for k, v in ep.range_constraints.items())).encode())  # the dynamic chunk's range
    for name, t in sorted({**ep.state_dict, **ep.constants}.items()):
        if isinstance(t, torch.Tensor):
            t = t.detach().contiguous().cpu()
            h.update(repr((name, tuple(t.shape), str(t.dtype))).encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr((name, type(t).__name__)).encode())
    return h.hexdigest()


def lower_together(programs: Mapping[str, object], partitioner: str):
    """{method: ExportedProgram} lowered in one ExecuTorch call -> its EdgeProgramManager. One call
    costs less than one per method (measured 10-20% on tiny), so this process lowers what it has to
    lower this way."""
    from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower

    partitioners = PARTITIONERS[partitioner]()
    passes = [fold_constants(), to_float_casts()] if partitioners else [fold_constants()]
    # Without the EXIR verifier after every step: it only checks (the .pte is the same, byte for byte:
    # measured on the tiny fp32 stateful, fp16 windowed and portable windowed programs) and took 8-27% of
    # a tiny XNNPACK lowering (AMD EPYC, 2026-12-07). Every program is still run against eager.
    config = EdgeCompileConfig(_check_ir_validity=False)
    remember_axes(programs)
    with one_frame_kept(programs):
        edge = (to_edge_transform_and_lower(dict(programs), transform_passes=passes, partitioner=partitioners,
                                            compile_config=config)
                if partitioners else to_edge(dict(programs), compile_config=config).transform(passes))
        if partitioners:
            edge = edge.transform([back_to_copies()])  # a float cast left outside: the portable kernel's again
    check_dynamic(programs, edge, "lowering")
    return edge


def to_executorch(edge, programs: Mapping[str, object]):
    """`edge` (lower_methods' result for `programs`) -> its ExecutorchProgramManager (`.buffer`: the
    .pte bytes): its memory is planned in one more retrace, kept symbolic as lowering is (one_frame_kept)."""
    remember_axes(programs)
    with one_frame_kept(programs):
        manager = edge.to_executorch()
    check_dynamic(programs, manager, "memory planning")
    return manager


# ExportedProgram -> its user inputs' symbolic axes [(input, axis)], as first seen by this module: a retrace
# that pins an axis writes the size into the program it was given too (the nodes' "val"), so check_dynamic
# compares with what the program was before any lowering
_AXES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _input_shapes(ep) -> list[tuple[str, tuple]]:
    names = set(ep.graph_signature.user_inputs)
    return [(n.name, tuple(n.meta["val"].shape)) for n in ep.graph.nodes if n.op == "placeholder" and n.name in names]


def remember_axes(programs: Mapping[str, object]) -> None:
    """Record each program's symbolic input axes, once (before its first lowering)."""
    for ep in programs.values():
        if ep not in _AXES:
            _AXES[ep] = [(name, axis) for name, shape in _input_shapes(ep) for axis, d in enumerate(shape)
                         if isinstance(d, torch.SymInt)]


def check_dynamic(programs: Mapping[str, object], manager, stage: str) -> None:
    """ValueError naming each input axis that was dynamic in `programs` (ExportedPrograms, as
    remember_axes first saw them) and is one size in `manager`'s methods (an ExecuTorch edge or
    executorch program manager)."""
    remember_axes(programs)
    for method, ep in programs.items():
        pinned = _pinned_dims(_AXES[ep], manager.exported_program(method))
        if pinned:
            raise ValueError(f"{stage} pinned the dynamic axes of {method}'s inputs ({', '.join(pinned)}): a guard in one of "
                             f"ExecuTorch's retraces narrowed the range to one size, so the program would refuse every other size")


@contextlib.contextmanager
def one_frame_kept(programs: Mapping[str, object]):
    """While lowering programs with a dynamic axis, keep it symbolic through ExecuTorch's retraces.

    Each retrace runs the fake kernels again with the range's hint. The fake conv asks whether its
    [1, C, 1, t] input is channels-last (torch/_subclasses/fake_impls.py, conv:
    `_conv_determine_backend_memory_format`), which at t = 1 it cannot tell from the strides, so it
    guards t > 1; a matmul decomposition's reshape guards 1 < t the same way. On chunks 1..2 that
    guard leaves one size and the axis is replaced by 2 (`range_refined_to_singleton`): every tensor
    of the program is then planned static, and a chunk-1 call fails in slice_copy (error 0x12: the
    cause of the --max-chunk 2 failure; on 1..N>2 the guard narrows the range to 2..N and the axis
    stays symbolic). Here the retraces are size-oblivious (as export is: variants.export_variant),
    and the conv's memory format for a symbolic input is contiguous, which is what the CPU conv
    gives the contiguous tensors the decoder passes. The .pte of chunks 1..4 and 1..25 is the same,
    byte for byte, with and without this (measured, tiny fp32 stateful, 2026-12-07). A windowed
    range (73..76 frames) met the same conv guard once its linears were dynamically quantized
    (int8-dynamic): `t > 4 * 5120` pinned it to 76, the largest. The fp32 windowed .pte is the same
    with and without this too (tiny, 2026-12-08).
    Upstream: pytorch/pytorch#182940 (fake-tensor execution on export metadata specializes shapes)."""
    if not any(ep.range_constraints for ep in programs.values()):
        yield
        return
    import torch.fx.experimental._config as fx_config

    backend_format = torch._C._conv_determine_backend_memory_format

    def memory_format(input, weight, backend):
        if any(isinstance(d, torch.SymInt) for d in input.shape):
            return torch.contiguous_format
        return backend_format(input, weight, backend)

    torch._C._conv_determine_backend_memory_format = memory_format
    try:
        with fx_config.patch(backed_size_oblivious=True):
            yield
    finally:
        torch._C._conv_determine_backend_memory_format = backend_format


def _pinned_dims(axes: list[tuple[str, int]], lowered) -> list[str]:
    """'input[axis] = size' for each of the symbolic `axes` [(input, axis)] that is a plain int in
    `lowered`'s user inputs (the same inputs, by name)."""
    after = dict(_input_shapes(lowered))
    return [f"{name}[{axis}] = {after[name][axis]}" for name, axis in axes if not isinstance(after[name][axis], torch.SymInt)]


def fold_constants():
    """An edge-program pass, run before partitioning: ExecuTorch's constant_prop_pass computes once,
    at lowering, every node whose inputs are all constants, and stores the result. Without it a
    windowed program rebuilds its positions, sliding-window mask and RoPE tables on every call,
    outside the delegate (int64 and bool ops); quantize/dequantize nodes are left alone."""
    from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    class FoldConstants(ExportedProgramPassBase):
        def call(self, ep):
            before = len(ep.graph.nodes)
            ep = constant_prop_pass(ep)
            return ExportedProgramPassResult(ep, len(ep.graph.nodes) != before)

    return FoldConstants()


def _serialized(edge, method: str):
    from executorch.exir.serde.serialize import serialize

    return serialize(edge.exported_program(method))


def lower_one(ep, partitioner: str):
    """One method's ExportedProgram -> its lowered edge program as exir serde bytes."""
    return _serialized(lower_together({_NAME: ep}, partitioner), _NAME)


def _in_worker(program: bytes, partitioner: str, quiet: bool):
    """Worker process: an ExportedProgram saved with torch.export.save -> (serde artifact, seconds),
    or (None, why) when it cannot be loaded here."""
    if quiet:
        from ..env import quiet_libraries

        quiet_libraries()
    torch.set_num_threads(1)
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (registers the ops a PT2E int8 program calls)

    t = time.perf_counter()
    try:
        ep = torch.export.load(io.BytesIO(program))
    except Exception as e:  # a program torch.export cannot carry between processes: the parent lowers it
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return lower_one(ep, partitioner), time.perf_counter() - t


def _cache_root() -> str | None:
    return os.environ.get(CACHE_ENV) or None


def _disk(key: str):
    root = _cache_root()
    return None if not root else os.path.join(root, f"{key}.lowered")


def _log(**fields) -> None:
    """One JSON line to C2W_LOWER_LOG (an O_APPEND write of one line: whole, with many writers),
    naming the test it happened in (pytest's PYTEST_CURRENT_TEST, which a CLI subprocess inherits)."""
    path = os.environ.get(LOG_ENV)
    if path:
        import json

        fields["test"] = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(fields) + "\n").encode())
        finally:
            os.close(fd)


def _cached(key: str, progress: Callable[[str], None] = lambda s: None):
    """The lowered method stored under `key`, or None: absent, or discarded because its bytes do not
    match the sha256 stored with them or do not unpickle (a torn write, a damaged disk, an edit)."""
    path = _disk(key)
    if not path or not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        digest, data = f.read(64), f.read()
    try:
        if digest.decode("ascii", "replace") != hashlib.sha256(data).hexdigest():
            raise ValueError("its sha256 does not match its bytes")
        return pickle.loads(data)
    except Exception as e:  # noqa: BLE001 -- whatever is wrong with an entry, it is lowered again
        progress(f"      lowering cache: discarded a corrupt entry {os.path.basename(path)} ({type(e).__name__}: "
                 f"{str(e)[:80]}); lowering it again")
        _log(event="discarded", key=key)
        with contextlib.suppress(FileNotFoundError):  # another process sharing the cache discarded it first
            os.unlink(path)
        return None


def _store(key: str, art) -> None:
    path = _disk(key)
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = pickle.dumps(art)
        atomic_write(path, lambda f: f.write(hashlib.sha256(data).hexdigest().encode() + data))


def _lower_in_pool(programs, misses, partitioner, n, quiet, keys, arts, progress) -> None:
    """Lower `misses` in `n` spawned worker processes, filling `arts` as each finishes. At most `n`
    saved programs are in flight, so a real-size program (457 MB) is held once per worker, not once
    per method."""
    def submit(pool, m):
        buf = io.BytesIO()
        torch.export.save(programs[m], buf)
        return pool.submit(_in_worker, buf.getvalue(), partitioner, quiet)

    todo = list(misses)
    with worker_pool(n) as pool:
        running = {submit(pool, m): m for m in todo[:n]}
        todo = todo[n:]
        while running:
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                m = running.pop(future)
                try:
                    art, took = future.result()  # (artifact, seconds), or (None, why it could not load)
                except concurrent.futures.process.BrokenProcessPool:
                    raise
                except Exception as e:
                    raise RuntimeError(f"lowering method {m} failed: {type(e).__name__}: {e}") from e
                if todo:
                    nxt = todo.pop(0)
                    running[submit(pool, nxt)] = nxt
                if art is None:  # left to the parent (arts[m] stays None)
                    progress(f"      {m}: a worker could not load it ({took}); lowering it in this process")
                    continue
                arts[m] = art
                _store(keys[m], art)
                _log(event="lowered", key=keys[m], method=m, partitioner=partitioner, seconds=took)
                progress(f"      lowered {m} in {took:.1f}s (worker)")


def lower_methods(programs: Mapping[str, object], partitioner: str,
                  progress: Callable[[str], None] = lambda s: None, quiet: bool = False):
    """{method: ExportedProgram} -> an EdgeProgramManager holding every method lowered (call
    `.to_executorch()` on it). Methods lowered before (the cache) are read back; the others are
    lowered in worker processes when there are more than one and more than one worker, else in one
    call here. Raises a RuntimeError naming the method(s) that failed."""
    keys = {m: program_key(ep, partitioner) for m, ep in programs.items()}
    arts = {m: _cached(k, progress) for m, k in keys.items()}
    with _claimed(sorted({keys[m] for m, a in arts.items() if a is None}), progress):
        for m, a in arts.items():  # what another process lowered while this one waited for its claim
            arts[m] = a if a is not None else _cached(keys[m], progress)
        return _lower_misses(programs, partitioner, progress, quiet, keys, arts)


@contextlib.contextmanager
def _claimed(keys: list[str], progress: Callable[[str], None]):
    """Hold an exclusive lock on each key (in sorted order: no two processes wait on each other) while
    this process lowers them, so two processes sharing a cache (xdist workers, CLI subprocesses) never
    lower the same program twice: the second waits, then reads the first one's lowering back."""
    root = _cache_root()
    if not root or not keys:
        yield
        return
    import fcntl

    os.makedirs(root, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for key in keys:
            f = stack.enter_context(open(os.path.join(root, f"{key}.lock"), "w"))
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                progress(f"      waiting for another process that is lowering the same program ({key[:12]})")
                fcntl.flock(f, fcntl.LOCK_EX)  # released when that process closes it, or dies
        yield


def _lower_misses(programs, partitioner, progress, quiet, keys, arts):
    """lower_methods past the cache look-up: `arts` {method: lowered or None}."""
    misses = [m for m, a in arts.items() if a is None]
    for m in programs:
        if arts[m] is not None:
            _log(event="hit", key=keys[m], method=m, partitioner=partitioner)
    if len(misses) < len(programs):
        progress(f"      lowering: {len(programs) - len(misses)} of {len(programs)} method(s) lowered before (same program)")
    n = 0
    if misses:
        size, available = max(program_bytes(programs[m]) for m in misses), available_memory()
        n, by_cores = workers_for(len(misses), size, available), workers_for(len(misses))
        if n < by_cores:
            progress(f"      lowering in {n} process(es), not {by_cores}: memory ({available / 2**30:.1f} GiB "
                     f"available, ~{size * WORKER_BYTES_PER_PROGRAM_BYTE / 2**30:.1f} GiB per worker)")
    if n > 1:
        progress(f"      lowering {len(misses)} method(s) in {n} worker processes")
        try:
            _lower_in_pool(programs, misses, partitioner, n, quiet, keys, arts, progress)
        except concurrent.futures.process.BrokenProcessPool as e:
            # e.g. a script without `if __name__ == "__main__"` cannot start spawned workers
            progress(f"      worker processes failed ({e}); lowering the rest in this process")
    rest = [m for m in misses if arts[m] is None]
    if rest:
        t = time.perf_counter()
        try:
            edge = lower_together({m: programs[m] for m in rest}, partitioner)
        except Exception as e:
            raise RuntimeError(f"lowering {rest} failed: {type(e).__name__}: {e}") from e
        took = time.perf_counter() - t
        for m in rest:  # one call: its seconds shared evenly
            _log(event="lowered", key=keys[m], method=m, partitioner=partitioner, seconds=took / len(rest))
        progress(f"      lowered {', '.join(rest)} in {took:.1f}s")
        if len(rest) == len(programs) and not _cache_root():  # nothing to combine with, nothing to keep
            return edge  # (serde of a real-size program alone costs tens of seconds)
        for m in rest:
            arts[m] = _serialized(edge, m)
            _store(keys[m], arts[m])
    return combine({m: arts[m] for m in programs})


def combine(arts: Mapping[str, object]):
    """{method: lowered edge program as exir serde bytes} -> one EdgeProgramManager (its
    constructor gathers the methods' named weights into one store, so equal weights are kept once)."""
    from executorch.exir import EdgeProgramManager
    from executorch.exir.serde.serialize import deserialize

    return EdgeProgramManager({m: deserialize(a) for m, a in arts.items()})
