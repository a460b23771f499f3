"""Playback under real-time deadlines: does a player fed by the stream ever run dry?

The model: the codes are all there (the decoder is the bottleneck), the calls run back to back,
so chunk i is ready when the compute times of chunks 0..i have elapsed. The player starts when the
first chunk is ready (plus an optional start-up buffer) and consumes audio at the sample rate.
When the next chunk is not ready as the previous one runs out, playback stalls (an underrun)
until it is, and every later deadline moves by the stall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Playback:
    first_audio_s: float  # compute time of the first chunk: when playback can start
    underruns: int  # chunks that were not ready when the player needed them
    stall_s: float  # total time the player sat waiting
    startup_buffer_s: float  # waiting this long after the first chunk plays through without an underrun

    def to_json(self) -> dict:
        return {"first_audio_ms": self.first_audio_s * 1e3, "underruns": self.underruns,
                "stall_ms": self.stall_s * 1e3, "startup_buffer_ms": self.startup_buffer_s * 1e3}

    def describe(self) -> str:
        return (f"first audio {self.first_audio_s * 1e3:.1f} ms, {self.underruns} underrun(s), "
                f"{self.stall_s * 1e3:.1f} ms stalled; start-up buffer for none: {self.startup_buffer_s * 1e3:.1f} ms")


def simulate_playback(compute_s: Sequence[float], audio_s: Sequence[float], startup_buffer_s: float = 0.0) -> Playback:
    """compute_s[i]: seconds to decode chunk i; audio_s[i]: seconds of audio it holds (same length, >= 1)."""
    if len(compute_s) != len(audio_s) or not compute_s:
        raise ValueError(f"need one compute time per chunk, got {len(compute_s)} times for {len(audio_s)} chunks")
    ready, played, need = 0.0, 0.0, 0.0  # ready: chunk i done; played: audio before chunk i
    clock = compute_s[0] + startup_buffer_s  # when chunk 0 starts playing
    underruns, stall = 0, 0.0
    for i, (c, a) in enumerate(zip(compute_s, audio_s)):
        ready += c
        # unstalled schedule: chunk i plays at first + played; it must be ready by then
        need = max(need, ready - (compute_s[0] + played))
        if ready > clock + 1e-12:
            underruns, stall, clock = underruns + 1, stall + ready - clock, ready
        clock += a
        played += a
    return Playback(compute_s[0], underruns, stall, need)
