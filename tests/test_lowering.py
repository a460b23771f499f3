"""Lowering a method at a time (program/lowering.py): the same .pte, byte for byte, as lowering every
method in one ExecuTorch call, whether in this process, in worker processes or from the session's
cache; a cache key that changes with anything that changes the program; and what happens when
worker processes cannot be used."""

import concurrent.futures.process
import json
import operator
import os

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from c2w_export.program import lowering
from c2w_export.program.flows import delegation, op_name
from c2w_export.program.prepare import prepare
from c2w_export.program.variants import example_inputs, export_variant, make_variant
from helpers import cases, slice_tails


def _export(decoder, variant, max_chunk, seed=0):
    m = make_variant(decoder, variant, max_chunk, 72)
    return m.method, export_variant(m, example_inputs(m, seed=seed))


@pytest.fixture(scope="module")
def prepared(decoder):
    return prepare(decoder)


@pytest.fixture(scope="module")
def two(prepared):
    """The windowed and stateful methods (chunks 1..25, context 72) of the session checkpoint,
    exported as the flows export them: the session's XNNPACK programs, so the lowering cache holds
    them once any test has lowered them (the cache keys below are computed without lowering)."""
    return dict(_export(prepared, v, 25) for v in ("windowed", "stateful"))


def _whole(programs, partitioner):
    """Every method in one ExecuTorch call (lower_together, no serde, no combine): what Lower did
    before lowering.py."""
    return lowering.lower_together(programs, partitioner).to_executorch().buffer


class _Small(torch.nn.Module):
    """The smallest module with what makes the byte identity worth checking: two methods over the same
    conv and linear weights (XNNPACK names each by the hash of its bytes, so the combined program
    keeps them once), a dynamic frame axis, and ops on each side of a delegate (an int64 lookup)."""

    def __init__(self, step: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.conv, self.proj, self.step = torch.nn.Embedding(32, 8), torch.nn.Conv1d(8, 8, 3), \
            torch.nn.Linear(8, 8), step

    def share(self, other: "_Small") -> "_Small":
        self.embed, self.conv, self.proj = other.embed, other.conv, other.proj
        return self

    def forward(self, codes, history):
        x = self.embed(codes).transpose(1, 2)  # [1, 8, T]
        x = torch.cat([history, x], -1) if self.step else torch.nn.functional.pad(x, (2, 0))
        y = self.proj(self.conv(x).transpose(1, 2))  # [1, T, 8]
        return (y, x[:, :, -2:]) if self.step else (y,)


@pytest.fixture(scope="module")
def small_two():
    """Two methods of _Small sharing weights, frames 1..25 dynamic, exported once (~1 s)."""
    return _small_programs()


def test_xnnpack_per_method_is_the_whole_program_byte_for_byte(small_two, monkeypatch, tmp_path):
    """Each method lowered alone (as a worker or an earlier test of the session did), carried as
    serde bytes (through a cache) and combined, against one to_edge_transform_and_lower call of both:
    the same bytes, so the weights the methods share stay shared. The property is the mechanism's,
    not the decoder's: a small module shows it (the decoder's own programs go through it in every
    XNNPACK test of the session)."""
    monkeypatch.setenv(lowering.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(lowering.WORKERS_ENV, "1")
    assert lowering.lower_methods(small_two, "xnnpack").to_executorch().buffer == _whole(small_two, "xnnpack")


def _swapped_methods(real_combine):
    """A deliberate bug for the test above: lower_methods whose combine swaps which method gets which
    lowered program (the bytes differ: each method's name and graph sit in the program)."""
    def combine(arts):
        names = list(arts)
        return real_combine(dict(zip(names, reversed([arts[m] for m in names]))))
    return combine


def test_the_byte_comparison_sees_methods_combined_wrongly(small_two, monkeypatch, tmp_path):
    monkeypatch.setenv(lowering.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(lowering.WORKERS_ENV, "1")
    monkeypatch.setattr(lowering, "combine", _swapped_methods(lowering.combine))
    assert lowering.lower_methods(small_two, "xnnpack").to_executorch().buffer != _whole(small_two, "xnnpack")


def test_worker_processes_give_the_same_bytes(small_two, monkeypatch, tmp_path):
    """Two worker processes, nothing cached, against the whole call; then the same again from the
    cache they filled, with no lowering."""
    monkeypatch.setenv(lowering.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(lowering.WORKERS_ENV, "2")
    lines = []
    whole = _whole(small_two, "xnnpack")
    assert lowering.lower_methods(small_two, "xnnpack", lines.append).to_executorch().buffer == whole
    assert "      lowering 2 method(s) in 2 worker processes" in lines
    assert sorted(line.split(" in ")[0].strip() for line in lines if line.endswith("(worker)")) == \
        ["lowered stateful", "lowered windowed"], lines
    assert len(list(tmp_path.glob("*.lowered"))) == 2
    lines.clear()
    assert lowering.lower_methods(small_two, "xnnpack", lines.append).to_executorch().buffer == whole
    assert lines == ["      lowering: 2 of 2 method(s) lowered before (same program)"]


CORRUPTIONS = [  # (id, what happens to a cache entry between two sessions)
    ("one-byte-flipped", lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:]),
    ("torn-write", lambda b: b[: len(b) // 2]),
    ("empty", lambda b: b""),
    ("digest-of-other-bytes", lambda b: b"0" * 64 + b[64:]),
]


@pytest.mark.parametrize("damage", cases(CORRUPTIONS))
def test_a_corrupt_cache_entry_is_discarded_and_lowered_again(small_two, monkeypatch, tmp_path, damage):
    """A cache kept across sessions (--lower-cache) is never trusted blindly: an entry whose bytes do
    not match the sha256 stored with them is discarded, said so, logged, and the method lowered
    again, to the same bytes as a fresh lowering."""
    one = {"windowed": small_two["windowed"]}
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv(lowering.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(lowering.LOG_ENV, str(log))
    monkeypatch.setenv(lowering.WORKERS_ENV, "1")
    fresh = lowering.lower_methods(one, "xnnpack").to_executorch().buffer
    (entry,) = (tmp_path / "cache").glob("*.lowered")
    entry.write_bytes(damage(entry.read_bytes()))
    lines = []
    assert lowering.lower_methods(one, "xnnpack", lines.append).to_executorch().buffer == fresh
    assert any(f"lowering cache: discarded a corrupt entry {entry.name}" in line for line in lines), lines
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert events == ["lowered", "discarded", "lowered"], events
    lowering.lower_methods(one, "xnnpack")  # the entry written again is whole: read back
    assert [json.loads(line)["event"] for line in log.read_text().splitlines()][-1] == "hit"


def _small_programs():
    offline = _Small(step=False)
    step = _Small(step=True).share(offline)
    t = torch.export.Dim("t", min=1, max=25)
    codes, history = torch.randint(0, 32, (1, 25)), torch.zeros(1, 8, 2)
    # weights frozen, as a loaded checkpoint's are (serde drops requires_grad, which a program records)
    return {name: torch.export.export(m.eval().requires_grad_(False), (codes, history), dynamic_shapes=({1: t}, None))
            for name, m in (("windowed", offline), ("stateful", step))}


def _lower_windowed(cache: str, log: str) -> str:
    """In a spawned process: lower the small windowed method through `cache` -> the sha256 of its .pte."""
    import hashlib

    os.environ.update({lowering.CACHE_ENV: cache, lowering.LOG_ENV: log, lowering.WORKERS_ENV: "1"})
    one = {"windowed": _small_programs()["windowed"]}
    return hashlib.sha256(lowering.lower_methods(one, "xnnpack").to_executorch().buffer).hexdigest()


def test_two_processes_never_lower_the_same_program_twice(tmp_path):
    """Two processes lowering one program at once through one cache (two xdist workers, a worker and a
    CLI subprocess): one lowers, the other waits for its claim and reads the lowering back."""
    import multiprocessing

    log = tmp_path / "log.jsonl"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        digests = pool.starmap(_lower_windowed, [(str(tmp_path / "cache"), str(log))] * 2)
    assert digests[0] == digests[1]
    assert sorted(json.loads(line)["event"] for line in log.read_text().splitlines()) == ["hit", "lowered"]


def test_the_cache_key_follows_the_lowering_code(small_two, monkeypatch):
    """An edit of the code that runs inside a lowering (the constant folding, the partition cap)
    changes every key: a kept cache never serves a lowering made by other code."""
    key = lowering.program_key(small_two["windowed"], "xnnpack")
    monkeypatch.setattr(lowering, "code_digest", lambda: "edited")
    assert lowering.program_key(small_two["windowed"], "xnnpack") != key


def test_a_broken_pool_falls_back_to_this_process(small_two, monkeypatch):
    """Worker processes that cannot start (a script without a __main__ guard breaks the pool) leave
    the lowering to this process, and the progress says so."""
    def broken(*args):
        raise concurrent.futures.process.BrokenProcessPool("a child process terminated abruptly")

    monkeypatch.delenv(lowering.CACHE_ENV, raising=False)
    monkeypatch.setenv(lowering.WORKERS_ENV, "2")
    monkeypatch.setattr(lowering, "_lower_in_pool", broken)
    lines = []
    one = {"windowed": small_two["windowed"]}
    assert lowering.lower_methods({**one, "again": small_two["windowed"]}, "portable", lines.append).methods == {"windowed", "again"}
    assert any("worker processes failed (a child process terminated abruptly); lowering the rest in this process" in s
               for s in lines), lines


def test_a_worker_that_cannot_load_the_program_leaves_it_to_the_parent():
    art, why = lowering._in_worker(b"not a saved program", "portable", True)
    assert art is None and why, why


KEY_CHANGES = [  # (id, what differs from the windowed method (chunks 1..25) of the prepared decoder)
    ("one-weight-1e-3", "weight"),
    ("another-chunk-range", "chunk"),
    ("another-partitioner", "partitioner"),
]


@pytest.mark.parametrize("change", cases(KEY_CHANGES))
def test_the_cache_key_changes_with_the_program(prepared, two, change):
    """A program that differs in one weight by 1e-3, in its chunk range, or in its partitioner never gets
    another's lowering: each has its own key. The key ignores the example inputs' values, which
    do not reach the graph."""
    import copy

    key = lowering.program_key(two["windowed"], "xnnpack")
    assert lowering.program_key(_export(prepared, "windowed", 25, seed=5)[1], "xnnpack") == key
    if change == "weight":
        other = copy.deepcopy(prepared)
        w = other.pre_transformer.layers[0].self_attn.o_proj.weight
        with torch.no_grad():
            w[0, 0] *= 1.001
        assert lowering.program_key(_export(other, "windowed", 25)[1], "xnnpack") != key
    elif change == "chunk":
        assert lowering.program_key(_export(prepared, "windowed", 24)[1], "xnnpack") != key
    else:
        assert lowering.program_key(two["windowed"], "portable") != key


@pytest.mark.parametrize("value,message", cases([
    ("zero", "0", "C2W_LOWER_WORKERS must be >= 1, got 0"),
    ("word", "two", "C2W_LOWER_WORKERS must be an integer, got 'two'"),
]))
def test_bad_worker_count_is_named(monkeypatch, value, message):
    monkeypatch.setenv(lowering.WORKERS_ENV, value)
    with pytest.raises(ValueError) as e:
        lowering.workers_for(3)
    assert str(e.value) == message


def test_workers_never_outnumber_the_methods(monkeypatch):
    monkeypatch.setenv(lowering.WORKERS_ENV, "8")
    assert [lowering.workers_for(n) for n in (1, 2, 12)] == [1, 2, 8]
    monkeypatch.delenv(lowering.WORKERS_ENV)
    assert lowering.workers_for(1) == 1 and lowering.workers_for(64) == lowering.cores()


def test_workers_fit_in_memory(monkeypatch):
    """Without C2W_LOWER_WORKERS, no more workers than memory holds (each ~12x its program's weights,
    beside ~2x per method the parent gathers): the real-size case that ran out of memory gets 1."""
    monkeypatch.delenv(lowering.WORKERS_ENV, raising=False)
    monkeypatch.setattr(lowering, "cores", lambda: 2)
    real, gib = 457_000_000, 2**30
    assert lowering.workers_for(6, real, available=13 * gib) == 1  # measured: 2 workers + parent > 24 GiB
    assert lowering.workers_for(6, real, available=20 * gib) == 2
    assert lowering.workers_for(6, 2_000_000, available=1 * gib) == 2  # tiny programs: the cores
    monkeypatch.setenv(lowering.WORKERS_ENV, "2")  # an explicit count is obeyed
    assert lowering.workers_for(6, real, available=1 * gib) == 2


def test_program_bytes_counts_weights_and_constants():
    ep = torch.export.export(torch.nn.Linear(8, 4), (torch.randn(1, 8),))
    assert lowering.program_bytes(ep) == (8 * 4 + 4) * 4


ORPHAN_SCRIPT = """
import os, time
from c2w_export.program.lowering import worker_pool
if __name__ == "__main__":
    pool = worker_pool(1)  # the pool the lowering uses
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 60)
    time.sleep(0.5)
    os.kill(os.getpid(), 9)  # the parent dies as the OOM killer kills it
"""


def test_lowering_workers_die_with_their_parent(tmp_path):
    """A killed run leaves no lowering worker behind (one left two 5 GB orphans at real size)."""
    import subprocess
    import sys
    import time

    script, out = tmp_path / "orphan.py", tmp_path / "out.txt"
    script.write_text(ORPHAN_SCRIPT)
    with out.open("w") as f:
        subprocess.run([sys.executable, str(script)], stdout=f, stderr=subprocess.DEVNULL, timeout=120)
    worker = int(out.read_text().split()[0])
    for _ in range(50):
        if not os.path.exists(f"/proc/{worker}"):
            break
        time.sleep(0.1)
    alive = os.path.exists(f"/proc/{worker}")
    if alive:
        os.kill(worker, 9)
    assert not alive, f"lowering worker {worker} outlived its killed parent"


# ---------------------------------------------------------------- constants folded at lowering
FOLDED_BY_DESIGN = {"full"}  # constant_prop_pass leaves fills alone (a big fill would bloat the file); ours are 0-d


def constant_only_outside(ep) -> list[str]:
    """The ops of a lowered program outside the delegate whose every input is a constant (a weight,
    buffer, lifted constant or literal): work each call would redo for the same result."""
    live, found = {n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs}, []
    for n in ep.graph.nodes:
        if n.op != "call_function":
            continue
        if any(a in live for a in n.all_input_nodes):
            live.add(n)
            continue
        name = op_name(n)
        if n.target is not operator.getitem and name != "executorch_call_delegate" and name not in FOLDED_BY_DESIGN:
            found.append(name)
    return found


class _PositionsMask(torch.nn.Module):
    """x [1, 8] + a mask from positions alone: what a windowed program's mask and RoPE tables are."""

    def forward(self, x):
        return x + (torch.arange(x.shape[-1]) < 4).to(x.dtype)


def _no_fold():
    from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

    class Nothing(ExportedProgramPassBase):
        def call(self, ep):
            return ExportedProgramPassResult(ep, False)

    return Nothing()


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "without-the-pass"])
def test_lowering_folds_what_depends_on_constants_only(monkeypatch, fold):
    """Positions and masks built from constants run once, at lowering; without the pass they stay
    as int64/bool ops outside the delegate on every call (and this check finds them)."""
    if not fold:
        monkeypatch.setattr(lowering, "fold_constants", _no_fold)
    x = torch.randn(1, 8)
    edge = lowering.lower_together({"forward": torch.export.export(_PositionsMask(), (x,))}, "xnnpack")
    found = constant_only_outside(edge.exported_program("forward"))
    assert (found == []) == fold, found
    if not fold:
        assert {"arange", "lt"} <= set(found), found


def test_windowed_program_recomputes_no_constant_and_expands_nothing_outside_the_delegate(two):
    """The tiny windowed program: nothing outside the delegate depends on constants alone (its
    positions, sliding-window mask and RoPE tables are folded), and the frame masks are broadcast,
    not materialized: no expand_copy or repeat runs on portable kernels (20 expand_copy took ~5 of
    a tiny windowed call's ~21 ms before)."""
    ep = lowering.lower_methods({"windowed": two["windowed"]}, "xnnpack").exported_program("windowed")  # the session's
    assert constant_only_outside(ep) == []
    outside = delegation(ep.graph)["outside"]
    assert not {"expand_copy", "repeat"} & set(outside), outside


# ---------------------------------------------------------------- dynamic programs, delegated whole
def test_dynamic_programs_are_delegated_whole(programs, pytestconfig):
    """Each variant's one XNNPACK method (chunks 1..max) runs as at most 3 partitions with no op
    outside the delegate between two of them: what stays outside prepares the inputs (positions,
    masks, the codebook lookup). Every reshape is delegated, and every new state but the position
    comes straight out of a delegate call (prepare.LastFrames: no state update runs outside)."""
    from helpers import require_flow

    require_flow(pytestconfig, "executorch_xnnpack")
    for variant in ("windowed", "stateful"):
        d = programs.get("executorch_xnnpack", variant)[0][variant].delegation
        print(f"{variant}: {d}")
        assert d["partitions"] <= 3 and d["between_ops"] == 0, (variant, d)
        assert "view_copy" not in d["outside"], (variant, d)
        assert d["outputs_outside"] == (1 if variant == "stateful" else 0), (variant, d)  # the position


def _symbolic_interleave(y, stride):
    """The deliberate bug: the phase interleave written as a reshape of the transposed tensor (export
    traces it with the size computed, a symbolic size XNNPACK does not delegate)."""
    b, channels, t = y.shape
    return y.view(b, channels // stride, stride, t).transpose(2, 3).reshape(b, channels // stride, t * stride)


class _Interleaved(torch.nn.Module):
    """The smallest graph the check needs: a conv whose output phases are interleaved in time
    (prepare.interleave_phases, looked up when called, so a patched one is what is traced) into a
    second conv, on a dynamic chunk."""

    def __init__(self):
        super().__init__()
        self.phases, self.after = torch.nn.Conv1d(4, 8, 3), torch.nn.Conv1d(4, 4, 1)

    def forward(self, x):
        from c2w_export.program import prepare as pp

        return torch.relu(self.after(pp.interleave_phases(self.phases(x), 2)))


INTERLEAVES = [  # (id, the interleave traced, whether the delegate splits)
    ("as-shipped", None, False),
    ("reshape-with-a-symbolic-size", _symbolic_interleave, True),
]


@pytest.mark.parametrize("interleave,splits", cases(INTERLEAVES))
def test_a_reshape_with_a_symbolic_size_splits_the_delegate(monkeypatch, interleave, splits):
    """The check above on a deliberate bug, on a small module (the decoder's phase interleave
    between two convs, chunks 4..27): the shipped interleave leaves nothing outside the delegate;
    the reshape with a symbolic size leaves view_copy between partitions, and more partitions."""
    from c2w_export.program import prepare as pp

    if interleave:
        monkeypatch.setattr(pp, "interleave_phases", interleave)
    ep = torch.export.export(_Interleaved().eval(), (torch.randn(1, 4, 10),),
                             dynamic_shapes=({2: torch.export.Dim("t", min=4, max=27)},))
    d = delegation(lowering.lower_together({"f": ep}, "xnnpack").exported_program("f").graph)
    if splits:
        assert d["between_ops"] > 0 and d["partitions"] > 2 and "view_copy" in d["outside"], d
    else:
        assert d["between_ops"] == 0 and d["partitions"] <= 2 and not d["outside"], d


def test_export_refuses_a_chunk_range_a_guard_narrowed(prepared):
    """A guard can narrow the dynamic range without an error from torch.export (a conv's Ne(t, 1)
    on a range of 1..2 leaves only 2); the program would refuse the other chunks, so export refuses
    it, naming the range it got and the one it wanted."""
    from c2w_export.program.variants import Stateful

    class Narrowed(Stateful):
        def forward(self, codes, *state):
            torch._check(codes.shape[2] >= 3)
            return super().forward(codes, *state)

    m = Narrowed(prepared, 4).eval()
    with pytest.raises(ValueError, match=r"^torch.export narrowed the codes' frame axis of stateful to 3\.\.4 \(wanted "
                                         r"1\.\.4: chunks 1\.\.4\)"):
        export_variant(m, example_inputs(m))


class _OneFrame(torch.nn.Module):
    """The smallest graph of the --max-chunk 2 failure: a conv over a frame axis whose range is 1..2."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(4, 4, 1)

    def forward(self, x):
        return self.conv(x)


KEPT = [  # (id, whether lowering keeps the frame axis symbolic)
    ("one-frame-kept", True),
    ("without-it", False),
]


@pytest.mark.parametrize("kept", cases(KEPT))
def test_a_range_of_one_and_two_frames_stays_dynamic(monkeypatch, kept):
    """A program for frames 1..2 (exported as the stateful methods are: size-obliviously) runs both
    sizes against eager. Without one_frame_kept, a guard of ExecuTorch's retraces pins the axis to 2
    and the 1-frame call fails in the runtime (the deliberate bug; on the decoder, check_dynamic
    names it at lowering)."""
    import contextlib

    import torch.fx.experimental._config as fx_config

    from c2w_export.program.flows import ExecuTorchLoaded

    if not kept:
        monkeypatch.setattr(lowering, "one_frame_kept", lambda programs: contextlib.nullcontext())
    module = _OneFrame().eval()
    with fx_config.patch(backed_size_oblivious=True):
        ep = torch.export.export(module, (torch.randn(1, 4, 2),), dynamic_shapes=({2: torch.export.Dim.DYNAMIC(min=1, max=2)},))

    def both_sizes():
        loaded = ExecuTorchLoaded(lowering.to_executorch(lowering.lower_together({"f": ep}, "xnnpack"), {"f": ep}).buffer)
        for t in (1, 2):
            x = torch.randn(1, 4, t)
            torch.testing.assert_close(loaded.run("f", [x])[0], module(x).detach())

    if kept:
        both_sizes()
    else:
        with pytest.raises((RuntimeError, ValueError)):
            both_sizes()


def test_check_dynamic_names_a_pinned_axis():
    """check_dynamic on a lowering whose program lost its symbolic axis (what lowering did to the
    decoder's chunks 1..2): a ValueError naming the method, the input and the size, also when the
    lowering wrote the size back into the program it was given."""
    from torch.export import Dim

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    dynamic = torch.export.export(Double(), (torch.randn(1, 4, 3),), dynamic_shapes=({2: Dim("t", min=2, max=5)},))
    static = torch.export.export(Double(), (torch.randn(1, 4, 3),))

    class Manager:  # what check_dynamic reads of an edge or executorch program manager
        def __init__(self, ep):
            self.ep = ep

        def exported_program(self, method):
            return self.ep

    lowering.check_dynamic({"f": dynamic}, Manager(dynamic), "lowering")  # the axis kept: nothing to say
    with pytest.raises(ValueError, match=r"^lowering pinned the dynamic axes of f's inputs \(x\[2\] = 3\): a guard"):
        lowering.check_dynamic({"f": dynamic}, Manager(static), "lowering")

    # A retrace that pins an axis writes the size into the program it was given too (int8-dynamic's
    # windowed method did, at 76 frames): the check compares with the axes as first seen, not as left.
    pinned = torch.export.export(Double(), (torch.randn(1, 4, 3),), dynamic_shapes=({2: Dim("t", min=2, max=5)},))
    lowering.remember_axes({"f": pinned})
    x = next(n for n in pinned.graph.nodes if n.op == "placeholder")
    x.meta["val"] = torch.empty(1, 4, 3)
    with pytest.raises(ValueError, match=r"\(x\[2\] = 3\)"):
        lowering.check_dynamic({"f": pinned}, Manager(static), "lowering")


@given(max_chunk=st.integers(1, 25))
@example(max_chunk=1)
@example(max_chunk=2)  # the range that failed in the runtime until one_frame_kept
@settings(max_examples=1)  # each example lowers a tiny XNNPACK program (~40 s, AMD EPYC)
def test_every_chunk_range_exports_and_runs_each_chunk(model_dir, decoder, tmp_path_factory, max_chunk):
    """export (XNNPACK, stateful, chunks 1..max_chunk) at a drawn --max-chunk, then one stream through
    the written program that calls every chunk size of the range once, against the offline decode at
    the fp32 gate."""
    from c2w_export.program.streaming import stream_check
    from c2w_export.program.tolerances import tolerance
    from c2w_export.ship.artifacts import open_artifacts
    from c2w_export.ship.export import export_artifacts

    out = tmp_path_factory.mktemp(f"max-chunk-{max_chunk}") / "artifacts"
    export_artifacts(model_dir, out, ramp=sorted({1, max_chunk}), max_chunk=max_chunk, variants=["stateful"], windows=1,
                     progress=lambda s: None)
    art = open_artifacts(out)
    assert [p["max_chunk"] for p in art.manifest["programs"]] == [max_chunk]
    calls = list(range(max_chunk, 0, -1))
    [check] = stream_check(decoder, art.programs().run, ["stateful"], [max_chunk], 0, sum(calls), 5,
                           tolerance("executorch_xnnpack"), calls=calls)
    assert check.passed, check.describe()


# ---------------------------------------------------------------- state updates inside the delegate
class _TwoHistories(torch.nn.Module):
    """Two causal convs, each carrying its history as state, around a 4x upsampling transposed
    conv, on a dynamic chunk (frames 2..25): a 6-sample history at 1 sample per frame and an
    18-sample one at 4 (prepare.sample_frames: a plain selection, and one of 2-sample frames)."""

    def __init__(self):
        super().__init__()
        from c2w_export.model.layers import CausalConv1d
        from c2w_export.program.prepare import FoldedCausalConv1d

        a, b = CausalConv1d(4, 4, 7), CausalConv1d(4, 4, 7, dilation=3)
        (a.state_name, a.rate), (b.state_name, b.rate) = ("a", 1), ("b", 4)
        self.a, self.b = FoldedCausalConv1d(a), FoldedCausalConv1d(b)
        self.up = torch.nn.ConvTranspose1d(4, 4, 4, stride=4)

    def forward(self, x, ha, hb):
        y, na = self.a(x, {"a.history": ha})
        y, nb = self.b(self.up(y), {"b.history": hb})
        return y, na["a.history"], nb["b.history"]


STATE_UPDATES = [  # (id, a patch, share_factories run, the ops outside the delegate, the plan holds I/O only)
    ("as-shipped", None, True, {"full": 1}, True),
    ("slices", slice_tails, True, {"slice_copy": 2}, False),
    ("without-share-factories", None, False, {"full": 2}, True),
]


@pytest.mark.parametrize("patch,share,outside,small", cases(STATE_UPDATES))
def test_state_updates_run_inside_the_delegate(monkeypatch, patch, share, outside, small):
    """Two state updates on a dynamic chunk, lowered (one partition: the weight cap off): with
    LastFrames and share_factories, one `full` (sized from the input) is all that runs outside the
    delegate, and the memory plan holds the inputs and outputs (and that [T, 1]) only. As slices
    (the model's own), each update runs outside on the whole concatenated chunk, which the plan then
    holds at the largest chunk. Without share_factories, each update builds its own zeros."""
    from c2w_export.program import flows
    from c2w_export.program.prepare import share_factories

    from c2w_export.program.partition import capped_xnnpack_partitioner

    if patch:
        patch(monkeypatch)
    # uncapped: the cap cuts this small graph's one partition in two, and the plan then holds the cut
    monkeypatch.setitem(lowering.PARTITIONERS, "xnnpack", lambda: [capped_xnnpack_partitioner(share=1.0)])
    t = torch.export.Dim.DYNAMIC(min=2, max=25)  # a named Dim fails on min(9 + 2t, 18 + 4t) == 9 + 2t
    inputs = (torch.randn(1, 4, 25), torch.zeros(1, 4, 6), torch.zeros(1, 4, 18))
    ep = torch.export.export(_TwoHistories().eval(), inputs, dynamic_shapes=({2: t}, None, None))
    if share:
        share_factories(ep.graph)
        ep.graph_module.recompile()
    programs = {"f": ep}
    edge = lowering.lower_together(programs, "xnnpack")
    d = delegation(edge.exported_program("f").graph)
    plan = flows.memory_plan(lowering.to_executorch(edge, programs).executorch_program)["f"]
    io = 4 * (4 * 25 + 4 * 100 + 2 * 4 * (6 + 18))  # float32 x, y and both states in and out
    assert d["outside"] == outside, d
    assert (plan <= io + 4 * 25 * 4) == small, (plan, io)  # room for the [T, 1] zeros (a concatenated chunk: 4 * 472)
    if small:
        assert d["between_ops"] == 0, d


# ---------------------------------------------------------------- float casts inside the delegate
class _Mixed(torch.nn.Module):
    """A float16 conv between two float32 ones, cast at both edges (a mixed-precision program's
    island), on a dynamic chunk (frames 7..30)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a, self.b, self.c = torch.nn.Conv1d(4, 8, 3), torch.nn.Conv1d(8, 8, 3).half(), torch.nn.Conv1d(8, 4, 3)
        for conv in (self.a, self.b, self.c):  # seeded: each case builds its own
            conv.weight.data = torch.randn(conv.weight.shape, generator=g).to(conv.weight.dtype)
            conv.bias.data = torch.randn(conv.bias.shape, generator=g).to(conv.bias.dtype)

    def forward(self, x):
        h = torch.relu(self.b(torch.relu(self.a(x)).to(torch.float16)))
        return self.c(h.to(torch.float32))


def _naive_casts(monkeypatch):
    """The deliberate bug: ExecuTorch's own config taking the dtype casts as they are (no
    c2w::float_cast): its preprocess then drops them as redundant memory-format copies."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.generic_node_configs import ToDimOrderCopyConfig

    from c2w_export.program.partition import capped_xnnpack_partitioner

    class AnyCast(ToDimOrderCopyConfig):
        def check_constraints(self, node, ep):
            return self.check_common_constraints(node, ep)

    configs = [AnyCast if c is ToDimOrderCopyConfig else c for c in ALL_PARTITIONER_CONFIGS]
    monkeypatch.setitem(lowering.PARTITIONERS, "xnnpack", lambda: [capped_xnnpack_partitioner(share=1.0, configs=configs)])
    monkeypatch.setattr(lowering, "to_float_casts", lowering.fold_constants)


def _casts_refused(monkeypatch):
    """The casts written as c2w::float_cast, but a partitioner that does not take them."""
    from c2w_export.program.partition import capped_xnnpack_partitioner

    monkeypatch.setitem(lowering.PARTITIONERS, "xnnpack", lambda: [capped_xnnpack_partitioner(share=1.0)])


def _casts_outside(monkeypatch):
    """The reference: the casts as ExecuTorch lowers them, on portable kernels outside the delegate."""
    _casts_refused(monkeypatch)
    monkeypatch.setattr(lowering, "to_float_casts", lowering.fold_constants)


CASTS = [  # (id, a patch, casts outside the delegate, the outputs equal the reference's)
    ("as-shipped", None, 0, True),
    ("cast-refused-by-the-partitioner", _casts_refused, 2, True),
    ("executorchs-config-taking-dtype-casts", _naive_casts, 0, False),
]


def _run_mixed(monkeypatch, patch, inputs):
    """_Mixed lowered (weight cap off) with `patch` applied -> (delegation, outputs per input)."""
    from executorch.runtime import Runtime

    from c2w_export.program.partition import capped_xnnpack_partitioner

    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    with monkeypatch.context() as m:
        m.setitem(lowering.PARTITIONERS, "xnnpack", lambda: [capped_xnnpack_partitioner(
            share=1.0, configs=[*ALL_PARTITIONER_CONFIGS, *lowering.register_casts()])])
        if patch:
            patch(m)
        ep = torch.export.export(_Mixed().eval(), (inputs[-1],),
                                 dynamic_shapes=({2: torch.export.Dim.DYNAMIC(min=7, max=30)},))
        programs = {"f": ep}
        edge = lowering.lower_together(programs, "xnnpack")
        d = delegation(edge.exported_program("f").graph)
        buffer = lowering.to_executorch(edge, programs).buffer
    program = Runtime.get().load_program(buffer)  # the runtime reads `buffer`: it stays referenced
    method = program.load_method("f")
    return d, [method.execute([x])[0] for x in inputs]


@pytest.mark.parametrize("patch,outside,equal", cases(CASTS))
def test_float_casts_run_inside_the_delegate(monkeypatch, patch, outside, equal):
    """A float16 island between float32 convs, lowered: as shipped, its two casts run inside the one
    delegate call (c2w::float_cast as XNNConvert) and every output is bit for bit what the program
    with the casts on portable kernels gives (chunks 7, 17, 30). A cast the partitioner refuses goes
    back to the portable kernel, and the program still runs. ExecuTorch's own config taking the
    casts as they are gives wrong audio: its preprocess drops them as memory-format copies."""
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(1, 4, t, generator=g) for t in (7, 17, 30)]
    _, want = _run_mixed(monkeypatch, _casts_outside, inputs)
    d, got = _run_mixed(monkeypatch, patch, inputs)
    assert d["outside"].get("_to_dim_order_copy", 0) == outside, d
    if patch is None:
        assert d["partitions"] == 1 and d["between_ops"] == 0, d
    assert all(torch.equal(a, b) for a, b in zip(got, want)) == equal


class _Half(torch.nn.Module):
    """A float16 conv, depthwise conv and pointwise conv between float32 I/O, on a dynamic chunk
    (frames 12..40): the kinds of conv a float16 decoder program holds."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.convs = torch.nn.Sequential(torch.nn.Conv1d(8, 16, 5), torch.nn.Conv1d(16, 16, 7, groups=16),
                                         torch.nn.Conv1d(16, 4, 1)).half()
        for p in self.convs.parameters():
            p.data = torch.randn(p.shape, generator=g).half()

    def forward(self, x):
        return self.convs(x.half()).float()


def _stock_conv_weights(monkeypatch):
    """ExecuTorch's own conv visitor: every conv filter and bias written as float32."""
    from executorch.backends.xnnpack.operators import node_visitor

    from c2w_export.program import fp16_weights

    monkeypatch.setitem(node_visitor._node_visitor_dict, fp16_weights.CONV, fp16_weights.stock())
    monkeypatch.setattr(lowering, "register_fp16_weights", lambda: None)


def _weights_through_bfloat16(monkeypatch):
    """The deliberate bug: float16 weights kept 16-bit, but rounded through bfloat16 on the way."""
    from executorch.backends.xnnpack.operators import node_visitor

    param = node_visitor.get_param_tensor
    monkeypatch.setattr(node_visitor, "get_param_tensor", lambda ep, node: (
        lambda t: t.to(torch.bfloat16).to(torch.float16) if t is not None and t.dtype == torch.float16 else t)(param(ep, node)))


def _run_half(monkeypatch, patch, inputs):
    """_Half lowered (weight cap off) with `patch` applied -> (.pte bytes, outputs per input)."""
    from executorch.runtime import Runtime

    from c2w_export.program.partition import capped_xnnpack_partitioner

    with monkeypatch.context() as m:
        m.setitem(lowering.PARTITIONERS, "xnnpack", lambda: (lowering.register_fp16_weights(), [
            capped_xnnpack_partitioner(share=1.0)])[1])
        if patch:
            patch(m)
        ep = torch.export.export(_Half().eval(), (inputs[-1],), dynamic_shapes=({2: torch.export.Dim.DYNAMIC(min=12, max=40)},))
        buffer = lowering.to_executorch(lowering.lower_together({"f": ep}, "xnnpack"), {"f": ep}).buffer
    program = Runtime.get().load_program(buffer)  # the runtime reads `buffer`: it stays referenced
    method = program.load_method("f")
    return len(buffer), [method.execute([x])[0] for x in inputs]


HALF_WEIGHTS = [  # (id, a patch, the float16 weights' bytes saved against ExecuTorch's float32, outputs equal its)
    ("as-shipped", None, True, True),
    ("executorchs-float32-filters", _stock_conv_weights, False, True),
    ("weights-rounded-through-bfloat16", _weights_through_bfloat16, True, False),
]


@pytest.mark.parametrize("patch,saved,equal", cases(HALF_WEIGHTS))
def test_float16_conv_weights_are_stored_as_float16(monkeypatch, patch, saved, equal):
    """Float16 convs (a conv, a depthwise conv, a pointwise conv) lowered: as shipped, their
    filters and biases take 2 bytes a value in the .pte, not ExecuTorch's 4 (fp16_weights), and
    every output is bit for bit what ExecuTorch's float32-stored weights give (chunks 12, 25, 40):
    XNNPACK packs the same float16 values. A serializer that changes a weight on the way fails."""
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(1, 8, t, generator=g) for t in (12, 25, 40)]
    stock_bytes, want = _run_half(monkeypatch, _stock_conv_weights, inputs)
    size, got = _run_half(monkeypatch, patch, inputs)
    values = sum(p.numel() for p in _Half().parameters())
    # 2 bytes a value saved, less the 16-byte alignment of each of the 6 tensors
    assert (stock_bytes - size >= 2 * values - 6 * 16) == saved and size <= stock_bytes, (stock_bytes, size, values)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) == equal
