"""Whole streams: stateful programs vs the offline decode, windowed streams measured and gated,
exported streams vs eager streams, state robustness (issue: streaming)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from c2w_export.model.validate import InputError, check_tensor
from c2w_export.program.compare import compare
from c2w_export.program.playback import simulate_playback
from c2w_export.program.flows import ModuleLoaded
from c2w_export.program.streaming import (
    StreamDecoder, check_ramp, schedule, steady_tolerance, stream_check, stream_frames, stream_stateful, stream_windowed,
)
from c2w_export.program.tolerances import tolerance
from c2w_export.program.variants import make_variant, method_name
from helpers import cases, codes as _codes, initial_state, numerics_row, offline as _offline, ramps, require_flow, seeds

STREAM_FLOWS = ("eager", "torch_export", "executorch_xnnpack")


# ---------------------------------------------------------------- schedule
@given(total=st.integers(1, 400), ramp=ramps())
def test_schedule_covers_stream_exactly(total, ramp):
    steps = schedule(total, ramp)
    assert sum(s.frames for s in steps) == total
    assert [s.start for s in steps] == [sum(x.frames for x in steps[:i]) for i in range(len(steps))]
    planned = (list(ramp) + [ramp[-1]] * total)[: len(steps)]
    assert [s.frames for s in steps[:-1]] == planned[:-1], "ramp then the last size repeated"
    assert steps[-1].frames == min(planned[-1], total - steps[-1].start), "the last call takes what remains"


SCHEDULES = [  # (id, total, ramp, [(start, frames)])
    ("through-the-ramp", 6, [2, 4], [(0, 2), (2, 4)]),
    ("last-call-takes-the-rest", 9, [2, 4], [(0, 2), (2, 4), (6, 3)]),
    ("shorter-than-the-first", 1, [2, 4], [(0, 1)]),
    ("last-size-repeated", 13, [1, 4], [(0, 1), (1, 4), (5, 4), (9, 4)]),
]


@pytest.mark.parametrize("total,ramp,steps", cases(SCHEDULES))
def test_schedule_by_hand(total, ramp, steps):
    assert [(s.start, s.frames) for s in schedule(total, ramp)] == steps


RAMP_BAD = [  # (id, ramp, max_chunk, message)
    ("empty", [], 25, r"^ramp must hold positive chunk sizes, got \[\]$"),
    ("zero", [0, 2], 25, r"^ramp must hold positive chunk sizes, got \[0, 2\]$"),
    ("past-the-max", [2, 26], 25, r"^ramp \[2, 26\] goes past the programs' largest chunk, 25$"),
]


@pytest.mark.parametrize("ramp,max_chunk,message", cases(RAMP_BAD))
def test_check_ramp_refuses(ramp, max_chunk, message):
    with pytest.raises(ValueError, match=message):
        check_ramp(ramp, max_chunk)


def test_schedule_rejects_empty_stream():
    with pytest.raises(ValueError, match="at least 1 frame"):
        schedule(0)


# ---------------------------------------------------------------- stateful vs offline
@pytest.fixture(scope="session", params=STREAM_FLOWS, ids=STREAM_FLOWS)
def stateful_run(request, programs, pytestconfig):
    require_flow(pytestconfig, request.param)
    programs.get(request.param, "stateful")
    return request.param, programs.runner(request.param, "stateful").run


def test_stateful_programs_within_tolerance(programs, stateful_run, ramp, numerics_log):
    """The build's checks (chunks drawn from the range, consecutive) and the loaded program at each
    ramp chunk, one stream each, against the flow's reference (the numerics rows)."""
    flow, _ = stateful_run
    results, _ = programs.get(flow, "stateful")
    r = results[method_name("stateful")]
    assert r.passed, r.failure()
    for c in ramp:
        d = programs.chunk_diff(flow, "stateful", c)
        numerics_log.append(numerics_row(flow, "stateful", c, d, r.stages))
        assert d.within(r.tolerance), f"{flow} stateful at chunk {c}: {d.describe()}"


@settings(max_examples=20)
@given(data=st.data())
def test_stateful_stream_equals_offline(decoder, stateful_run, ramp, data):
    """Any stream length 1..3W+1 and a ramp drawn from the whole chunk range: T*hop samples equal
    to the offline eager decode within the stateful-stream tolerance."""
    flow, run = stateful_run
    w = decoder.config.sliding_window
    total = data.draw(st.integers(1, 3 * w + 1), label="T")
    sub = data.draw(ramps(max(ramp)), label="ramp")
    codes = _codes(decoder, total, data.draw(seeds, label="seed"))
    init = initial_state(decoder)
    res = stream_stateful(run, init, codes, decoder.config.hop, sub)
    assert res.wav.shape == (1, total * decoder.config.hop)
    d = compare(res.wav, _offline(decoder, codes))
    assert d.within(tolerance("stateful_stream")), f"{flow} T={total} ramp={sub}: {d.describe()}"


@pytest.mark.parametrize("total", [1, 7, 8, 9, 83, 130], ids=lambda t: f"T{t}")
def test_stateful_stream_lengths(decoder, stateful_run, ramp, total, oracle):
    """Whole stateful streams of every flow against upstream's offline decode."""
    flow, run = stateful_run
    codes = _codes(decoder, total, total)
    res = stream_stateful(run, initial_state(decoder), codes, decoder.config.hop, ramp)
    d = compare(res.wav, oracle.offline(codes))
    assert d.within(tolerance("stateful_stream")), f"{flow} T={total} vs upstream: {d.describe()}"


@settings(max_examples=20)
@given(data=st.data())
def test_stateful_irregular_chunks_equal_offline(decoder, stateful_run, ramp, data):
    """A stream cut into a drawn sequence of irregular chunk sizes (any 1..max, in any order, as a
    talker emits them), each one call of the one program, state fed back: equal to the offline
    decode."""
    flow, run = stateful_run
    sizes = data.draw(st.lists(st.integers(1, max(ramp)), min_size=1, max_size=8), label="chunks")
    codes = _codes(decoder, sum(sizes), data.draw(seeds, label="seed"))
    state, pieces, pos = initial_state(decoder), [], 0
    for n in sizes:
        out = run(method_name("stateful"), (codes[:, :, pos:pos + n], *state))
        pieces.append(out[0])
        state, pos = tuple(out[1:]), pos + n
    d = compare(torch.cat(pieces, -1), _offline(decoder, codes))
    assert d.within(tolerance("stateful_stream")), f"{flow} chunks {sizes}: {d.describe()}"


# ---------------------------------------------------------------- windowed streams
@pytest.fixture(scope="session")
def eager_windowed(decoder, ramp, context):
    return ModuleLoaded({method_name("windowed"): make_variant(decoder, "windowed", max(ramp), context)}).run


def test_windowed_stream_exact_from_frame_0(decoder, eager_windowed, ramp, context, numerics_log):
    """A windowed stream equals the offline decode from frame 0: the start (history < context,
    its pad marked absent) at the fp32 gate, the steady state after `context` frames at
    steady_tolerance. Both rows go to the numerics report."""
    hop = decoder.config.hop
    total = context + 3 * ramp[-1] + 5
    codes = _codes(decoder, total, 21)
    res = stream_windowed(eager_windowed, codes, hop, context, ramp)
    off = _offline(decoder, codes)
    start = compare(res.wav[:, : context * hop], off[:, : context * hop])
    steady = compare(res.wav[:, context * hop:], off[:, context * hop:])
    numerics_log.append(numerics_row("eager", "windowed-stream-start", None, start, reference="offline decode"))
    numerics_log.append(numerics_row("eager", "windowed-stream-steady", None, steady, reference="offline decode"))
    print(f"windowed stream vs offline: start {start.describe()}; steady {steady.describe()}")
    assert start.within(tolerance("eager")), f"start: {start.describe()}"
    assert steady.within(steady_tolerance(decoder, context)), f"steady state: {steady.describe()}"


@pytest.mark.parametrize("total", [1, 7, 9, 83, 130], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("flow", ["eager", "torch_export", "executorch_xnnpack", "executorch_portable"])
def test_windowed_stream_vs_upstream(decoder, programs, ramp, context, flow, total, oracle, pytestconfig):
    """Whole windowed streams of every flow against upstream's offline decode, from frame 0 (tiny:
    the context covers the receptive field, so the whole stream is exact)."""
    require_flow(pytestconfig, flow)
    assert context >= decoder.receptive_frames()
    run = programs.runner(flow, "windowed").run
    codes = _codes(decoder, total, 100 + total)
    d = compare(stream_windowed(run, codes, decoder.config.hop, context, ramp).wav, oracle.offline(codes))
    assert d.within(tolerance(flow)), f"{flow} T={total} vs upstream: {d.describe()}"


def test_receptive_field_bounds_the_exact_context(decoder, ramp):
    """A context of `receptive_frames` gives an exact steady state; half of it does not (so the
    bound is not vacuous and the exact/approximate gate choice means something)."""
    reach, hop = decoder.receptive_frames(), decoder.config.hop
    codes = _codes(decoder, 3 * reach, 4)
    off = _offline(decoder, codes)
    for ctx, exact in ((reach, True), (reach // 2, False)):
        run = ModuleLoaded({method_name("windowed"): make_variant(decoder, "windowed", max(ramp[:2]), ctx)}).run
        d = compare(stream_windowed(run, codes, hop, ctx, ramp[:2]).wav[:, ctx * hop:], off[:, ctx * hop:])
        assert d.within(tolerance("windowed_steady_exact")) == exact, f"context {ctx} (reach {reach}): {d.describe()}"


def test_receptive_frames_is_the_measured_reach(decoder):
    """receptive_frames() (a sum over the stack's structure) against a measurement: change the codes
    of frame 0 only; the last output frame that moves is exactly `receptive_frames()` frames later."""
    cfg = decoder.config
    a = _codes(decoder, 60, 31)
    b = a.clone()
    b[:, :, 0] = (b[:, :, 0] + 1) % cfg.codebook_size
    moved = (_offline(decoder, a) - _offline(decoder, b)).abs().reshape(60, cfg.hop).amax(-1)
    assert int(moved.nonzero().max()) == decoder.receptive_frames() == 26


def test_steady_gate_is_exact_from_the_receptive_field_on(decoder):
    reach = decoder.receptive_frames()
    assert steady_tolerance(decoder, reach) == tolerance("windowed_steady_exact")
    assert steady_tolerance(decoder, reach - 1) == tolerance("windowed_steady_approx")


def test_stream_frames_by_hand():
    assert stream_frames([1, 2, 3, 5], 4, 10) == 10 + 11 + 5 + 4
    assert stream_frames([2], 1) == 5


def _eager_both(decoder, chunk, context):
    return ModuleLoaded({method_name("windowed"): make_variant(decoder, "windowed", chunk, context),
                         method_name("stateful"): make_variant(decoder, "stateful", chunk, 0)})


def _off_by_1e3_when_stateful(run):
    def wrong(method, inputs):
        out = run(method, inputs)
        if method.startswith("stateful"):
            wav = out[0].clone()
            wav[..., 0] += 1e-3
            out = (wav, *out[1:])
        return out
    return wrong


@pytest.mark.mutation_first("c2w_export.program.streaming.x_stream_check__*")
def test_stream_check_rows_by_hand(decoder):
    """stream_check on eager programs of both variants (ramp [2], context = the receptive field):
    each row's name, reference, gate and compared length as written here, all passing; a stream
    no longer than the context has no steady row; a stateful program off by 1e-3 on one sample
    fails the stateful row and only it."""
    hop, ctx = decoder.config.hop, decoder.receptive_frames()
    run, gate = _eager_both(decoder, 2, ctx).run, tolerance("eager")
    frames = stream_frames([2], 1, ctx)
    rows = stream_check(decoder, run, ["stateful", "windowed"], [2], ctx, frames, 5, gate)
    assert [(r.name, r.reference, r.tolerance, r.diff.numel) for r in rows] == [
        ("stateful", "offline decode", gate, frames * hop),
        ("windowed", "eager windowed stream", gate, frames * hop),
        ("windowed-start", f"offline decode, first {ctx} frames", gate, ctx * hop),
        ("windowed-steady", f"offline decode after {ctx} frames", tolerance("windowed_steady_exact"), (frames - ctx) * hop),
    ]
    assert all(r.passed for r in rows), [r.describe() for r in rows]
    short = stream_check(decoder, run, ["windowed"], [2], ctx, ctx, 5, gate)
    assert [r.name for r in short] == ["windowed", "windowed-start"]
    bad = stream_check(decoder, _off_by_1e3_when_stateful(run), ["stateful", "windowed"], [2], ctx, frames, 5, gate)
    assert [r.name for r in bad if not r.passed] == ["stateful"]
    assert bad[0].describe().startswith("stateful vs offline decode: max_abs=0.001 at (0, ")
    assert bad[0].describe().endswith(f"(tolerance max_abs<={gate.max_abs:g}, SNR>={gate.min_snr_db:g} dB)")


def test_stream_check_own_rows(decoder):
    """With an own reference (reduced precision): each variant's stream is also compared with the
    same stream through `own`, first, at `own_gate`, and the other rows use `gate`; an own reference
    off by 1e-3 in its stateful method fails the stateful-own row only."""
    ctx = decoder.receptive_frames()
    run, gate, own_gate = _eager_both(decoder, 2, ctx).run, tolerance("stress"), tolerance("eager")
    frames = stream_frames([2], 1, ctx)
    rows = stream_check(decoder, run, ["stateful", "windowed"], [2], ctx, frames, 5, gate, run, own_gate, "its own")
    assert [(r.name, r.reference, r.tolerance) for r in rows] == [
        ("stateful-own", "its own stream", own_gate), ("stateful", "offline decode", gate),
        ("windowed-own", "its own stream", own_gate), ("windowed", "eager windowed stream", gate),
        ("windowed-start", f"offline decode, first {ctx} frames", gate),
        ("windowed-steady", f"offline decode after {ctx} frames", gate),  # the looser of the steady gate and `gate`
    ]
    assert all(r.passed for r in rows)
    bad = stream_check(decoder, run, ["stateful", "windowed"], [2], ctx, frames, 5, gate,
                       _off_by_1e3_when_stateful(run), own_gate, "its own")
    assert [r.name for r in bad if not r.passed] == ["stateful-own"]


def test_stream_result_records_each_step_and_its_time(decoder):
    res = stream_stateful(_eager_both(decoder, 2, 0).run, initial_state(decoder), _codes(decoder, 5, 2),
                          decoder.config.hop, [2])
    assert res.steps == schedule(5, [2]) and len(res.steps) == 3
    assert len(res.seconds) == 3 and all(0 < s < 60 for s in res.seconds)


@pytest.mark.parametrize("flow", ["torch_export", "executorch_xnnpack", "executorch_portable"])
def test_exported_windowed_stream_passes_stream_check(decoder, programs, ramp, context, flow, pytestconfig):
    """The production stream check on every artifact flow: vs the eager windowed stream, and the
    start and the steady state vs the offline decode."""
    require_flow(pytestconfig, flow)
    run = programs.runner(flow, "windowed").run
    checks = stream_check(decoder, run, ["windowed"], ramp, context, stream_frames(ramp, 3, context), 8, tolerance(flow))
    assert [c.name for c in checks] == ["windowed", "windowed-start", "windowed-steady"]
    assert all(c.passed for c in checks), [c.describe() for c in checks]


# ---------------------------------------------------------------- incremental decode
@pytest.fixture(scope="session", params=["eager", "executorch_xnnpack"])
def incremental_flow(request, programs, pytestconfig):
    require_flow(pytestconfig, request.param)
    return request.param


@settings(max_examples=6)
@given(data=st.data())
@pytest.mark.parametrize("variant", ["stateful", "windowed"])
def test_stream_decoder_irregular_arrivals(decoder, programs, incremental_flow, ramp, context, variant, data, oracle):
    """Codes pushed in irregular sizes (0 to 2x the largest chunk, as a talker would emit them):
    the yielded audio, concatenated, equals upstream's offline decode, and every pushed frame is
    decoded by its push (nothing waits for a ramp step), in calls no larger than the schedule's."""
    cfg = decoder.config
    total = data.draw(st.integers(1, context + 2 * ramp[-1]), label="T")
    codes = _codes(decoder, total, data.draw(seeds, label="seed"))
    sizes = data.draw(st.lists(st.integers(0, 2 * ramp[-1]), min_size=1, max_size=12), label="arrivals")
    sizes.append(max(total - sum(sizes), 0))  # the rest of the stream, in one last arrival
    run = programs.runner(incremental_flow, variant).run
    dec = StreamDecoder(run, variant, cfg.hop, ramp, context, initial_state(decoder) if variant == "stateful" else ())
    pieces, pos = [], 0
    for n in sizes:
        pieces += dec.push(codes[:, :, pos:pos + n])
        pos = min(pos + n, total)  # arrivals past the end of the stream are empty pushes
        assert dec.decoded_frames == pos, "pushed frames were left waiting"
    pieces += dec.finish()
    wav = torch.cat(pieces, -1)
    assert wav.shape == (1, total * cfg.hop)
    planned = list(ramp) + [ramp[-1]] * len(dec.steps)
    assert all(s.frames <= planned[i] for i, s in enumerate(dec.steps)), "a call larger than the schedule's"
    gate = tolerance("stateful_stream" if variant == "stateful" else incremental_flow)
    d = compare(wav, oracle.offline(codes))
    assert d.within(gate), f"{incremental_flow} {variant} T={total} arrivals={sizes}: {d.describe()}"


STREAM_MISUSE = [  # (id, what the caller does, the whole message)
    ("float-codes", lambda d, c: d.push(c.float()), r"^pushed codes must be int64 \[1, Q, n\], got torch.float32 \[1, 16, 3\]$"),
    ("not-a-tensor", lambda d, c: d.push([[1]]), r"^pushed codes must be int64 \[1, Q, n\], got list \[\]$"),
    ("2d-codes", lambda d, c: d.push(c[0, :1]), r"^pushed codes must be int64 \[1, Q, n\], got torch.int64 \[1, 3\]$"),
    ("batch-2", lambda d, c: d.push(c.repeat(2, 1, 1)), r"^pushed codes must be int64 \[1, Q, n\], got torch.int64 \[2, 16, 3\]$"),
    ("wrong-q", lambda d, c: (d.push(c[:, :, :1]), d.push(c[:, 1:])), "^pushed codes have 15 quantizers, the stream has 16$"),
    ("push-after-finish", lambda d, c: (d.push(c), d.finish(), d.push(c)), "^this stream is finished; start a new StreamDecoder$"),
    ("empty-stream", lambda d, c: d.finish(), "^a stream needs at least 1 frame, got 0$"),
]


@pytest.mark.parametrize("misuse,message", cases(STREAM_MISUSE))
def test_stream_decoder_rejects_misuse(decoder, eager_windowed, ramp, context, misuse, message):
    dec = StreamDecoder(eager_windowed, "windowed", decoder.config.hop, ramp, context)
    with pytest.raises(InputError, match=message):
        misuse(dec, _codes(decoder, 3, 0))


DECODER_MISUSE = [  # (id, StreamDecoder arguments after run, the whole message)
    ("unknown-variant", ("stateless", 1920), r"^unknown variant 'stateless'; choose from \('windowed', 'stateful'\)$"),
    ("stateful-without-state", ("stateful", 1920), "^a stateful stream needs its initial state$"),
]


@pytest.mark.parametrize("args,message", cases(DECODER_MISUSE))
def test_stream_decoder_refuses_bad_set_up(eager_windowed, args, message):
    with pytest.raises(ValueError, match=message):
        StreamDecoder(eager_windowed, *args)


def test_stream_decoder_decodes_each_push_at_once_and_checks_it(decoder):
    """A push decodes what has arrived at once, in calls of at most the scheduled size (ramp [2]:
    5 frames are 2 + 2 + 1), a push short of a ramp step included; `finish` has nothing left, and
    the `check` callback sees every pushed tensor."""
    seen = []
    dec = StreamDecoder(_eager_both(decoder, 2, 0).run, "stateful", decoder.config.hop, [2],
                        state=initial_state(decoder), check=seen.append)
    c = _codes(decoder, 6, 4)
    assert [x.shape[-1] for x in dec.push(c[:, :, :5])] == [2 * 1920, 2 * 1920, 1920]
    assert [x.shape[-1] for x in dec.push(c[:, :, 5:])] == [1920] and dec.decoded_frames == 6
    assert dec.finish() == [] and [(s.start, s.frames) for s in dec.steps] == [(0, 2), (2, 2), (4, 1), (5, 1)]
    assert [x.shape[-1] for x in seen] == [5, 1] and torch.equal(seen[0], c[:, :, :5])


# ---------------------------------------------------------------- state robustness
def _one(t, flat_index, value):
    """A copy of `t` with one element (by flat index) set to `value`."""
    t = t.clone()
    t.view(-1)[flat_index] = value
    return t


def _state_case(decoder, edit):
    init = list(initial_state(decoder))
    edit(init)
    return init


STATE_BAD = [
    ("wrong-shape", lambda s: s.__setitem__(1, torch.zeros(*s[1].shape[:-1], s[1].shape[-1] + 1)), "must have shape"),
    ("wrong-dtype", lambda s: s.__setitem__(1, s[1].double()), "must be float32"),
    ("nan", lambda s: s.__setitem__(2, s[2].clone().fill_(float("nan"))), "non-finite value"),
    ("inf", lambda s: s.__setitem__(3, s[3].clone().fill_(float("inf"))), "non-finite value"),
    # one bad element among finite ones, each sign of inf: the finite-sum fast path must see them
    ("one-nan", lambda s: s.__setitem__(2, _one(s[2], 0, float("nan"))), r"non-finite value \(nan\) at index \(0, 0, 0"),
    ("one-minus-inf", lambda s: s.__setitem__(3, _one(s[3], -1, float("-inf"))), r"non-finite value \(-inf\)"),
    ("pos-float", lambda s: s.__setitem__(0, s[0].float()), "must be int64"),
    ("pos-negative", lambda s: s.__setitem__(0, s[0] - 5), "non-negative"),
]


@pytest.mark.parametrize("edit,message", cases(STATE_BAD))
def test_bad_state_is_rejected(decoder, stateful_run, ramp, edit, message):
    flow, run = stateful_run
    state = _state_case(decoder, edit)
    with pytest.raises(InputError, match=message):
        run(method_name("stateful"), (_codes(decoder, ramp[0], 0), *state))


def test_finite_state_whose_sum_overflows_is_accepted():
    """check_tensor's fast path (a finite sum) falls back to each element when the sum overflows:
    finite values summing past float32's range pass, and one inf among them is still named."""
    big = torch.full((1, 4, 3), 3e38)
    check_tensor(big, "state 'x'", (1, 4, 3), torch.float32)
    check_tensor(torch.full((1, 4, 3), 6e4, dtype=torch.float16), "state 'h'", (1, 4, 3), torch.float16)
    big[0, 2, 1] = float("inf")
    with pytest.raises(InputError, match=r"state 'x' holds a non-finite value \(inf\) at index \(0, 2, 1\)"):
        check_tensor(big, "state 'x'", (1, 4, 3), torch.float32)


def test_interleaved_streams_are_independent(decoder, stateful_run, ramp):
    flow, run = stateful_run
    c = ramp[0]
    a, b = _codes(decoder, 4 * c, 1), _codes(decoder, 4 * c, 2)
    init = initial_state(decoder)
    apart = [stream_stateful(run, init, x, decoder.config.hop, [c]).wav for x in (a, b)]
    sa, sb, wa, wb = init, init, [], []
    m = method_name("stateful")
    for i in range(4):
        out = run(m, (a[:, :, i * c:(i + 1) * c], *sa))
        wa.append(out[0]); sa = tuple(out[1:])
        out = run(m, (b[:, :, i * c:(i + 1) * c], *sb))
        wb.append(out[0]); sb = tuple(out[1:])
    assert torch.equal(torch.cat(wa, -1), apart[0]) and torch.equal(torch.cat(wb, -1), apart[1])


def test_state_spec_names_every_site(decoder):
    names = [n for n, _, _ in decoder.state_spec()]
    cfg = decoder.config
    assert names[0] == "pos" and len(names) == len(set(names))
    kv = [n for n in names if n.endswith((".k", ".v"))]
    assert len(kv) == 2 * cfg.num_hidden_layers
    shapes = {n: s for n, s, _ in decoder.state_spec()}
    assert shapes["pre_transformer.layers.0.self_attn.k"] == (1, cfg.num_key_value_heads, cfg.sliding_window - 1, cfg.head_dim)
    assert shapes["pre_conv.history"] == (1, cfg.codebook_dim, 2)


# ---------------------------------------------------------------- playback under deadlines
PLAYBACK = [  # (id, compute s per chunk, audio s per chunk, start-up buffer, expected (underruns, stall s, buffer s))
    ("fast-compute", [0.1, 0.1, 0.1], [0.5, 0.5, 0.5], 0.0, (0, 0.0, 0.0)),
    ("one-slow-chunk", [1.0, 1.0], [0.5, 0.5], 0.0, (1, 0.5, 0.5)),
    # chunk 1 ready at 0.2+0.9=1.1, needed at 0.2+0.16=0.36; chunk 2 ready at 1.2, needed at 1.1+0.32
    ("small-first-chunk", [0.2, 0.9, 0.1], [0.16, 0.32, 0.64], 0.0, (1, 0.74, 0.74)),
    ("buffer-covers-it", [0.2, 0.9, 0.1], [0.16, 0.32, 0.64], 0.74, (0, 0.0, 0.74)),
    # stalls of 1.0 (chunk 1: ready 2.5, needed 1.5) and 0.5 (chunk 2: ready 3.5, needed 2.5 + 0.5);
    # the buffer that avoids both is the larger deficit (chunk 2: 3.5 - (1.0 + 1.0))
    ("two-stalls", [1.0, 1.5, 1.0], [0.5, 0.5, 0.5], 0.0, (2, 1.5, 1.5)),
    ("real-time-exactly", [0.5, 0.5, 0.5], [0.5, 0.5, 0.5], 0.0, (0, 0.0, 0.0)),
]


@pytest.mark.parametrize("compute,audio,buffer,expected", cases(PLAYBACK))
def test_simulate_playback_hand_computed(compute, audio, buffer, expected):
    """Against schedules worked out by hand (the comments): underruns, total stall and the
    start-up buffer that would have avoided every underrun."""
    p = simulate_playback(compute, audio, buffer)
    assert p.first_audio_s == compute[0]
    assert (p.underruns, p.stall_s, p.startup_buffer_s) == pytest.approx(expected, abs=1e-9)


def test_simulate_playback_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="one compute time per chunk"):
        simulate_playback([0.1, 0.2], [0.5])


def test_stream_result_times_by_hand():
    """Real-time factor and the player's audio per chunk from a made-up stream: 2 steps of 1 and 3
    frames at hop 4 and 8 samples/s (0.5 s and 1.5 s of audio), computed in 0.25 s and 1.0 s."""
    from c2w_export.program.streaming import Step, StreamResult

    r = StreamResult(torch.zeros(1, 16), [Step(0, 1), Step(1, 3)], [0.25, 1.0])
    assert r.real_time_factor(8) == pytest.approx(1.25 / 2.0)
    assert r.first_chunk_seconds == 0.25
    p = r.playback(4, 8)  # chunk 0 is ready at 0.25 and plays to 0.75; chunk 1 is ready at 1.25: one 0.5 s stall
    assert (p.first_audio_s, p.underruns, p.stall_s) == pytest.approx((0.25, 1, 0.5))


def test_manifest_ramp_reason_names_the_measurement_only_for_the_default():
    from c2w_export.program.streaming import DEFAULT_RAMP, DEFAULT_RAMP_REASON, ramp_reason

    assert ramp_reason(list(DEFAULT_RAMP)) == DEFAULT_RAMP_REASON and "55.8 ms" in DEFAULT_RAMP_REASON
    assert ramp_reason([2, 4, 8, 16, 25]) == "given to export with --ramp"
