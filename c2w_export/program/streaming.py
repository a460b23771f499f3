"""Stream drivers: feed a code stream through a variant's one method (any chunk 1..max), whole or
as it arrives.

Schedule: the ramp (default 1 2 4 8 16 25) caps the size of each call, then its last size repeated.
Small chunks first give early audio; large chunks later cost less per frame. The ramp is a
decode-time choice: any sizes within the program's chunk range.

A call decodes what has arrived, up to its scheduled size: pushed frames never wait for a ramp
step to fill, and the last chunk of a stream is just the frames that remain. Any stream length
T >= 1 yields exactly T*hop samples.

Windowed start of stream: the windowed program takes `context + chunk` frames plus `history`, the
number of real frames before the chunk. While fewer than `context` frames of history exist, the
window is left-padded with code 0 and `history` says so; the program decodes the pad as the
offline decode's causal zero padding, so the stream is exact from frame 0. After `context` frames
(the steady state) it is exact when the context covers the decoder's receptive field, and at a
measured floor otherwise (`stream_check`).

`StreamDecoder` is the one driver: codes are pushed as they arrive (any sizes) and audio comes out
at once; `stream_stateful` / `stream_windowed` push a whole stream at once, which follows the ramp.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from ..model.decoder import Code2Wav
from ..model.validate import InputError
from .codes import random_codes
from .compare import Diff, compare
from .flows import ModuleLoaded
from .playback import Playback, simulate_playback
from .tolerances import Tolerance, tolerance
from .variants import VARIANTS, initial_state, make_variant, method_name

DEFAULT_RAMP = (1, 2, 4, 8, 16, 25)  # the defaults of export, decode and demo, defined once
# Why DEFAULT_RAMP: written into every manifest exported with it (measured in reports/real/bench.md).
DEFAULT_RAMP_REASON = (
    "lowest first audio with the fewest stalls at real size (XNNPACK stateful, 20 s stream, AMD EPYC 2 cores, "
    "reports/real/bench.md): 1 2 4 8 16 25 first audio 55.8 ms, 1 underrun, 9.5 ms stall; 2 4 8 16 25 113.7 ms, "
    "3 underruns, 41.1 ms; 4 8 16 25 166.1 ms, none; RTF 0.50 for all three")
DEFAULT_CONTEXT = 72  # windowed left context frames (the real model's sliding window)
DEFAULT_MAX_CHUNK = 25  # the largest chunk a program takes (memory is planned for it): the ramp's last size
PAD_CODE = 0

RunFn = Callable[[str, Sequence[Tensor]], tuple[Tensor, ...]]


@dataclass(frozen=True)
class Step:
    start: int  # first frame of this chunk in the stream
    frames: int  # frames decoded by this call (its chunk size)


def _step_size(ramp: Sequence[int], i: int) -> int:
    """The largest size of call i: the ramp, then its last size repeated."""
    return ramp[i] if i < len(ramp) else ramp[-1]


def schedule(total: int, ramp: Sequence[int] = DEFAULT_RAMP) -> list[Step]:
    """The calls decoding a whole stream of `total` frames: the ramp's sizes, then its last size
    repeated; the last call takes what remains."""
    if total < 1:
        raise ValueError(f"a stream needs at least 1 frame, got {total}")
    ramp = check_ramp(ramp)
    steps, pos = [], 0
    while pos < total:
        steps.append(Step(pos, min(_step_size(ramp, len(steps)), total - pos)))
        pos += steps[-1].frames
    return steps


@dataclass
class StreamResult:
    wav: Tensor  # [1, T*hop]
    steps: list[Step]
    seconds: list[float] = field(default_factory=list)  # compute time per step

    @property
    def first_chunk_seconds(self) -> float:
        return self.seconds[0]

    def real_time_factor(self, sample_rate: int) -> float:
        """Compute time / audio time."""
        return sum(self.seconds) / (self.wav.shape[-1] / sample_rate)

    def playback(self, hop: int, sample_rate: int) -> Playback:
        """A real-time player fed by this stream's measured calls (program/playback.py)."""
        return simulate_playback(self.seconds, [s.frames * hop / sample_rate for s in self.steps])


def windowed_inputs(history: Tensor, new: Tensor, context: int) -> tuple[Tensor, Tensor]:
    """One windowed call's inputs: codes [1, Q, context + n] (the real history [1, Q, h <= context]
    left-padded with code 0, then the new frames [1, Q, n]) and `history` int64 [1] = h, which tells
    the program that the left pad is absent, not audio."""
    h = history.shape[-1]
    left = torch.full((*new.shape[:2], context - h), PAD_CODE, dtype=new.dtype)
    return torch.cat([left, history, new], dim=-1), torch.tensor([h], dtype=torch.int64)


class StreamDecoder:
    """Incremental decode through a variant's method (`windowed` or `stateful`).

    `push(codes [1, Q, n])` takes frames as they arrive, in any sizes, and decodes them at once, in
    calls of at most the scheduled size each, returning the audio chunks ([1, frames * hop] each);
    `finish()` ends the stream. It carries the state (stateful) or the last `context` frames
    (windowed). `steps` and `seconds` record what ran and its compute time."""

    def __init__(self, run: RunFn, variant: str, hop: int, ramp: Sequence[int] = DEFAULT_RAMP, context: int = 0,
                 state: Sequence[Tensor] = (), check: Callable[[Tensor], None] | None = None):
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
        if variant == "stateful" and not state:
            raise ValueError("a stateful stream needs its initial state")
        self.run, self.variant, self.hop, self.context = run, variant, hop, context
        self.ramp, self.state, self.check = check_ramp(ramp), tuple(state), check
        self.pending: Tensor | None = None  # frames received and not yet decoded [1, Q, n]
        self.history: Tensor | None = None  # windowed: the last <= context decoded frames
        self.steps: list[Step] = []
        self.seconds: list[float] = []
        self.finished = False

    @property
    def decoded_frames(self) -> int:
        return self.steps[-1].start + self.steps[-1].frames if self.steps else 0

    def push(self, codes: Tensor) -> list[Tensor]:
        if self.finished:
            raise InputError("this stream is finished; start a new StreamDecoder")
        if not isinstance(codes, Tensor) or codes.dim() != 3 or codes.shape[0] != 1 or codes.dtype != torch.int64:
            raise InputError(f"pushed codes must be int64 [1, Q, n], got "
                             f"{getattr(codes, 'dtype', type(codes).__name__)} {list(getattr(codes, 'shape', []))}")
        if self.check is not None:
            self.check(codes)
        if self.pending is not None and codes.shape[1] != self.pending.shape[1]:
            raise InputError(f"pushed codes have {codes.shape[1]} quantizers, the stream has {self.pending.shape[1]}")
        self.pending = codes if self.pending is None else torch.cat([self.pending, codes], dim=-1)
        out = []
        while self.pending.shape[-1]:
            out.append(self._decode(min(self.pending.shape[-1], _step_size(self.ramp, len(self.steps)))))
        return out

    def finish(self) -> list[Tensor]:
        """End the stream (every pushed frame is already decoded)."""
        if self.finished:
            return []
        self.finished = True
        if self.decoded_frames == 0:
            raise InputError("a stream needs at least 1 frame, got 0")
        return []

    def _decode(self, frames: int) -> Tensor:
        new, self.pending = self.pending[:, :, :frames], self.pending[:, :, frames:]
        if self.variant == "stateful":
            inputs: tuple[Tensor, ...] = (new, *self.state)
        else:
            history = self.history if self.history is not None else new[:, :, :0]
            inputs = windowed_inputs(history, new, self.context)
        t0 = time.perf_counter()
        out = self.run(method_name(self.variant), inputs)
        self.seconds.append(time.perf_counter() - t0)
        self.steps.append(Step(self.decoded_frames, frames))
        if self.variant == "stateful":
            self.state = tuple(out[1:])
        else:
            seen = new if self.history is None else torch.cat([self.history, new], dim=-1)
            self.history = seen[:, :, max(seen.shape[-1] - self.context, 0):]
        return out[0]

    def stream(self, chunks: Iterable[Tensor]) -> Iterator[Tensor]:
        """A generator over arriving code chunks: yields each audio chunk as soon as it is decoded."""
        for codes in chunks:
            yield from self.push(codes)
        yield from self.finish()

    def result(self, pieces: Sequence[Tensor]) -> StreamResult:
        return StreamResult(torch.cat(list(pieces), dim=-1), list(self.steps), list(self.seconds))


def stream_stateful(run: RunFn, initial_state: Sequence[Tensor], codes: Tensor, hop: int,
                    ramp: Sequence[int] = DEFAULT_RAMP, calls: Sequence[int] | None = None) -> StreamResult:
    """codes int64 [1, Q, T] through the `stateful` method, state fed back -> [1, T*hop]; in the
    ramp's chunk sizes, or exactly in `calls` (chunk sizes in any order, summing to T) when given."""
    dec = StreamDecoder(run, "stateful", hop, [max(calls)] if calls else ramp, state=initial_state)
    return dec.result(list(dec.stream(_pieces(codes, calls))))


def stream_windowed(run: RunFn, codes: Tensor, hop: int, context: int,
                    ramp: Sequence[int] = DEFAULT_RAMP, calls: Sequence[int] | None = None) -> StreamResult:
    """codes int64 [1, Q, T] through the `windowed` method -> [1, T*hop] (`ramp`, `calls`: as
    stream_stateful)."""
    dec = StreamDecoder(run, "windowed", hop, [max(calls)] if calls else ramp, context)
    return dec.result(list(dec.stream(_pieces(codes, calls))))


def _pieces(codes: Tensor, calls: Sequence[int] | None) -> list[Tensor]:
    """codes cut into pushes of `calls` frames (each decoded in one call of its size); else whole."""
    if not calls:
        return [codes]
    if sum(calls) != codes.shape[-1] or min(calls) < 1:
        raise ValueError(f"calls {list(calls)} must be positive and sum to the stream's {codes.shape[-1]} frames")
    return list(torch.split(codes, list(calls), dim=-1))


def ramp_reason(ramp: Sequence[int]) -> str:
    """The manifest's record of why the ramp was chosen."""
    return DEFAULT_RAMP_REASON if tuple(ramp) == DEFAULT_RAMP else "given to export with --ramp"


def check_ramp(ramp: Sequence[int], max_chunk: int | None = None) -> list[int]:
    """Sorted distinct chunk sizes within 1..max_chunk, or ValueError naming the ramp."""
    out = sorted(set(int(r) for r in ramp))
    if not out or out[0] < 1:
        raise ValueError(f"ramp must hold positive chunk sizes, got {list(ramp)}")
    if max_chunk is not None and out[-1] > max_chunk:
        raise ValueError(f"ramp {out} goes past the programs' largest chunk, {max_chunk}")
    return out


def stream_frames(ramp: Sequence[int], extra: int, context: int = 0) -> int:
    """A stream length that runs through the whole ramp, one repeat of its last size and a short
    last chunk of `extra` frames, after `context` frames (so a windowed stream also has a steady
    state to check)."""
    return context + sum(ramp) + ramp[-1] + extra


@dataclass(frozen=True)
class StreamCheck:
    name: str  # "stateful", "windowed" or "windowed-steady"
    reference: str  # what the stream was compared with
    diff: Diff
    tolerance: Tolerance

    @property
    def passed(self) -> bool:
        return self.diff.within(self.tolerance)

    def describe(self) -> str:
        return (f"{self.name} vs {self.reference}: {self.diff.describe()} (tolerance max_abs<="
                f"{self.tolerance.max_abs:g}, SNR>={self.tolerance.min_snr_db:g} dB)")


def steady_tolerance(decoder: Code2Wav, context: int) -> Tolerance:
    """The gate of a windowed stream's steady state against the offline decode."""
    exact = context >= decoder.receptive_frames()
    return tolerance("windowed_steady_exact" if exact else "windowed_steady_approx")


def stream_check(decoder: Code2Wav, run: RunFn, variants: Sequence[str], ramp: Sequence[int], context: int,
                 frames: int, seed: int, gate: Tolerance, own: RunFn | None = None,
                 own_gate: Tolerance | None = None, own_name: str = "own reference",
                 calls: Sequence[int] | None = None) -> list[StreamCheck]:
    """A whole stream of `frames` random frames through the programs behind `run`, in the ramp's
    chunk sizes or exactly in `calls` (any order, summing to `frames`: an irregular stream):

    - stateful: vs the offline decode, at `gate`;
    - windowed: vs the eager windowed stream (same window builder: catches exporter bugs) at
      `gate`; its start (the first `context` frames, every window short of history) vs the offline
      decode at `gate` (exact by construction); its steady state (after `context` frames) vs the
      offline decode at `steady_tolerance`, or at `gate` when that is looser (reduced precision).
      The offline decode shares no window builder.
    - with `own` (reduced precision, gate side 1): each variant's stream vs the same stream through
      the own reference's methods, at `own_gate`; `gate` is then the quality floor (side 2)."""
    cfg = decoder.config
    codes = random_codes(cfg.num_quantizers, frames, cfg.codebook_size, seed)
    with torch.no_grad():
        offline = decoder(codes)[:, 0]
    steady = min(steady_tolerance(decoder, context), gate, key=lambda t: t.min_snr_db)
    out = []
    for v in variants:
        def through(r: RunFn) -> Tensor:
            if v == "stateful":
                return stream_stateful(r, initial_state(decoder), codes, cfg.hop, ramp, calls).wav
            return stream_windowed(r, codes, cfg.hop, context, ramp, calls).wav

        got = through(run)
        if own is not None:
            out.append(StreamCheck(f"{v}-own", f"{own_name} stream", compare(got, through(own)), own_gate or gate))
        if v == "stateful":
            out.append(StreamCheck("stateful", "offline decode", compare(got, offline), gate))
            continue
        eager = ModuleLoaded({method_name("windowed"): make_variant(decoder, "windowed", max(calls or ramp), context)})
        ref = stream_windowed(eager.run, codes, cfg.hop, context, ramp, calls).wav
        out.append(StreamCheck("windowed", "eager windowed stream", compare(got, ref), gate))
        start = min(context, frames) * cfg.hop
        if start:
            out.append(StreamCheck("windowed-start", f"offline decode, first {start // cfg.hop} frames",
                                   compare(got[:, :start], offline[:, :start]), gate))
        if frames > context:
            out.append(StreamCheck("windowed-steady", f"offline decode after {context} frames",
                                   compare(got[:, start:], offline[:, start:]), steady))
    return out
