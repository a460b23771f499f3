"""Decode code streams through a shipped artifacts directory: the library behind `c2w-export decode`
and `demo`. Streams follow the manifest's ramp, or any ramp within the programs' chunk range
(program.streaming).

- `decode(artifacts, codes)`: a whole stream -> `Decoded` (audio, schedule, timings, playback).
- `open_stream(artifacts)`: a `StreamDecoder` to push codes into as they arrive (from a TTS talker)
  and get audio chunks back; `StreamDecoder.stream(chunks)` is the generator form.
Every method is loaded and run once at its largest chunk (a warm-up call) before the first chunk,
so the load time (the cold start) is measured apart from the first audio, and the first chunk costs
a warm call (the runtime's first call of a method sets up what later calls reuse).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from torch import Tensor

from ..model.validate import check_codes
from ..program.playback import Playback
from ..program.streaming import Step, StreamDecoder, StreamResult, check_ramp
from ..program.variants import method_name
from .artifacts import Artifacts, open_artifacts


@dataclass
class Decoded:
    wav: Tensor  # float32 [1, T*hop]
    variant: str  # "stateful" | "windowed"
    sample_rate: int
    ramp: list[int]
    steps: list[Step]  # the chunk schedule that was run
    seconds: list[float]  # compute time per step (every method loaded before the first)
    load_seconds: float  # the cold start: the child-process probe of each .pte, then loading every method and one warm-up call each

    @property
    def audio_seconds(self) -> float:
        return self.wav.shape[-1] / self.sample_rate

    @property
    def first_chunk_seconds(self) -> float:
        return self.seconds[0]

    @property
    def real_time_factor(self) -> float:
        """Compute time / audio time."""
        return sum(self.seconds) / self.audio_seconds

    def playback(self, hop: int) -> Playback:
        return StreamResult(self.wav, self.steps, self.seconds).playback(hop, self.sample_rate)

    def to_json(self, hop: int) -> dict:
        return {"variant": self.variant, "ramp": self.ramp, "frames": sum(s.frames for s in self.steps),
                "audio_s": self.audio_seconds, "load_ms": self.load_seconds * 1e3, "rtf": self.real_time_factor,
                "steps": [{"start": s.start, "frames": s.frames, "ms": t * 1e3}
                          for s, t in zip(self.steps, self.seconds)],
                "playback": self.playback(hop).to_json()}


def default_variant(variants: list[str]) -> str:
    """Stateful when shipped (it is exact against the offline decode), else windowed."""
    return "stateful" if "stateful" in variants else "windowed"


def _choose(art: Artifacts, variant: str | None, ramp: Sequence[int] | None) -> tuple[str, list[int]]:
    dec = art.decode
    variant = variant or default_variant(dec["variants"])
    if variant not in dec["variants"]:
        raise ValueError(f"{art.root} holds variant(s) {dec['variants']}, not {variant}")
    spec = art.specs.get(method_name(variant))
    if spec is None:
        raise ValueError(f"{art.root} names variant {variant} but holds no method {method_name(variant)!r}")
    try:
        ramp = check_ramp(ramp if ramp else dec["ramp"], spec.max_chunk)
    except ValueError as e:
        raise ValueError(f"{e} ({art.root}: {variant} takes chunks {spec.min_chunk}..{spec.max_chunk})") from None
    return variant, ramp


def open_stream(artifacts: str | Path | Artifacts, variant: str | None = None,
                ramp: Sequence[int] | None = None) -> tuple[StreamDecoder, float]:
    """An incremental decoder over the shipped programs, every method loaded and warmed up (one
    call at its largest chunk), after re-hashing every file and running each .pte once in a child
    process (ship/probe.py). Returns it and the load seconds (the probe included).
    Pushed codes are checked (InputError) before they reach a program."""
    art = artifacts if isinstance(artifacts, Artifacts) else open_artifacts(artifacts)
    art.require_files()
    variant, ramp = _choose(art, variant, ramp)
    dec = art.decode
    t0 = time.perf_counter()
    programs = art.programs()
    programs.preload()
    load = time.perf_counter() - t0
    state = art.initial_state() if variant == "stateful" else ()
    check = lambda c: check_codes(c, dec["num_quantizers"], dec["codebook_size"])
    return StreamDecoder(programs.run, variant, dec["hop"], ramp, dec["context_frames"], state, check), load


def decode(artifacts: str | Path | Artifacts, codes: Tensor, variant: str | None = None,
           ramp: Sequence[int] | None = None) -> Decoded:
    """codes int64 [1, Q, T] -> audio through the shipped programs (see open_stream).

    Raises ArtifactError / ManifestError for a damaged directory, InputError for bad codes and
    ValueError for a variant or ramp the directory does not hold."""
    art = artifacts if isinstance(artifacts, Artifacts) else open_artifacts(artifacts)
    # checked here too (the stream checks each push): bad codes fail before the methods load
    check_codes(codes, art.decode["num_quantizers"], art.decode["codebook_size"])
    stream, load = open_stream(art, variant, ramp)
    res = stream.result(list(stream.stream([codes])))
    return Decoded(res.wav, stream.variant, art.decode["sample_rate"], list(stream.ramp), res.steps, res.seconds, load)
