"""Stream drivers: feed a whole code stream through per-chunk programs of any flow.

Schedule: the ramp (default 2 4 8 16 25), then its last size repeated. Small chunks first give
early audio; large chunks later cost less per frame.

Last partial chunk: when fewer frames remain than the next scheduled size, the driver uses the
smallest ramp size >= the remainder, right-pads the codes with frames of code 0 and keeps only the
remainder's samples. The decoder is causal, so the padding cannot change the kept samples: any
stream length T >= 1 yields exactly T*hop samples, equal to what an unpadded decode would give.

Windowed start of stream: the windowed program always takes `context + chunk` frames. While
fewer than `context` frames of history exist, the window is left-padded with frames of code 0
(the program cannot be told that history is absent). That pad is audible to the decoder: the
first `context` frames of a windowed stream differ from the offline decode. After them (the steady
state) the stream is gated against the offline decode (`stream_check`): exact up to fp32 noise
when the context covers the decoder's receptive field, at a measured floor otherwise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from ..model.decoder import Code2Wav
from .codes import random_codes
from .compare import Diff, compare
from .flows import ModuleLoaded
from .tolerances import Tolerance, tolerance
from .variants import initial_state, make_variant, method_name

DEFAULT_RAMP = (2, 4, 8, 16, 25)  # the defaults of export, decode and demo, defined once
DEFAULT_CONTEXT = 72  # windowed left context frames (the real model's sliding window)
PAD_CODE = 0

RunFn = Callable[[str, Sequence[Tensor]], tuple[Tensor, ...]]


@dataclass(frozen=True)
class Step:
    start: int  # first frame of this chunk in the stream
    frames: int  # real frames decoded (<= chunk)
    chunk: int  # program size used (frames + right padding)


def schedule(total: int, ramp: Sequence[int] = DEFAULT_RAMP) -> list[Step]:
    """The chunk steps covering `total` frames (see the module docstring for the last chunk)."""
    if total < 1:
        raise ValueError(f"a stream needs at least 1 frame, got {total}")
    ramp = check_ramp(ramp)
    planned = list(ramp)
    steps, pos, i = [], 0, 0
    while pos < total:
        size = planned[i] if i < len(planned) else planned[-1]
        remaining = total - pos
        if remaining >= size:
            steps.append(Step(pos, size, size))
        else:
            chunk = next((r for r in ramp if r >= remaining), ramp[-1])
            steps.append(Step(pos, remaining, chunk))
        pos += steps[-1].frames
        i += 1
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


def _pad_right(codes: Tensor, n: int) -> Tensor:
    return torch.cat([codes, torch.full((*codes.shape[:2], n), PAD_CODE, dtype=codes.dtype)], dim=-1) if n else codes


def stream_stateful(run: RunFn, initial_state: Sequence[Tensor], codes: Tensor, hop: int,
                    ramp: Sequence[int] = DEFAULT_RAMP) -> StreamResult:
    """codes int64 [1, Q, T] through `stateful_chunk_<n>` methods, state fed back -> [1, T*hop]."""
    state = tuple(initial_state)
    steps = schedule(codes.shape[-1], ramp)
    pieces, seconds = [], []
    for s in steps:
        chunk_codes = _pad_right(codes[:, :, s.start:s.start + s.frames], s.chunk - s.frames)
        t0 = time.perf_counter()
        out = run(method_name("stateful", s.chunk), (chunk_codes, *state))
        seconds.append(time.perf_counter() - t0)
        pieces.append(out[0][:, : s.frames * hop])
        state = tuple(out[1:])
    return StreamResult(torch.cat(pieces, dim=-1), steps, seconds)


def windowed_inputs(codes: Tensor, step: Step, context: int) -> Tensor:
    """The `context + chunk` frame window for one step: history (left-padded with code 0 while
    the stream is shorter than `context`), the new frames, right padding for a last partial chunk."""
    lo = step.start - context
    history = codes[:, :, max(lo, 0):step.start]
    left = torch.full((*codes.shape[:2], max(-lo, 0)), PAD_CODE, dtype=codes.dtype)
    new = _pad_right(codes[:, :, step.start:step.start + step.frames], step.chunk - step.frames)
    return torch.cat([left, history, new], dim=-1)


def stream_windowed(run: RunFn, codes: Tensor, hop: int, context: int,
                    ramp: Sequence[int] = DEFAULT_RAMP) -> StreamResult:
    """codes int64 [1, Q, T] through `chunk_<n>` windowed methods -> [1, T*hop]."""
    steps = schedule(codes.shape[-1], ramp)
    pieces, seconds = [], []
    for s in steps:
        window = windowed_inputs(codes, s, context)
        t0 = time.perf_counter()
        out = run(method_name("windowed", s.chunk), (window,))
        seconds.append(time.perf_counter() - t0)
        pieces.append(out[0][:, : s.frames * hop])
    return StreamResult(torch.cat(pieces, dim=-1), steps, seconds)


def check_ramp(ramp: Sequence[int]) -> list[int]:
    """Sorted distinct positive chunk sizes, or ValueError naming the ramp."""
    out = sorted(set(int(r) for r in ramp))
    if not out or out[0] < 1:
        raise ValueError(f"ramp must hold positive chunk sizes, got {list(ramp)}")
    return out


def stream_frames(ramp: Sequence[int], extra: int, context: int = 0) -> int:
    """A stream length that runs through the whole ramp, one repeat of its last size and a partial
    chunk of `extra` frames (extra < the smallest chunk keeps it partial), after `context` frames
    (so a windowed stream also has a steady state to check)."""
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
                 frames: int, seed: int, gate: Tolerance) -> list[StreamCheck]:
    """A whole stream of `frames` random frames through the programs behind `run`:

    - stateful: vs the offline decode, at `gate`;
    - windowed: vs the eager windowed stream (same window builder: catches exporter bugs) at
      `gate`, and its steady state (after `context` frames) vs the offline decode, which does not
      share the window builder, at `steady_tolerance`."""
    cfg = decoder.config
    codes = random_codes(cfg.num_quantizers, frames, cfg.codebook_size, seed)
    with torch.no_grad():
        offline = decoder(codes)[:, 0]
    out = []
    for v in variants:
        if v == "stateful":
            got = stream_stateful(run, initial_state(decoder), codes, cfg.hop, ramp).wav
            out.append(StreamCheck("stateful", "offline decode", compare(got, offline), gate))
            continue
        got = stream_windowed(run, codes, cfg.hop, context, ramp).wav
        eager = ModuleLoaded({method_name("windowed", c): make_variant(decoder, "windowed", c, context) for c in ramp})
        ref = stream_windowed(eager.run, codes, cfg.hop, context, ramp).wav
        out.append(StreamCheck("windowed", "eager windowed stream", compare(got, ref), gate))
        start = context * cfg.hop
        if frames > context:
            out.append(StreamCheck("windowed-steady", f"offline decode after {context} frames",
                                   compare(got[:, start:], offline[:, start:]), steady_tolerance(decoder, context)))
    return out
