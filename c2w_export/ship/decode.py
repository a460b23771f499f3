"""Decode a code stream through a shipped artifacts directory: the library behind
`c2w-export decode` and `demo`. The stream follows the manifest's ramp (see program.streaming)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from ..model.validate import check_codes
from ..program.streaming import Step, stream_stateful, stream_windowed
from .artifacts import Artifacts, open_artifacts


@dataclass
class Decoded:
    wav: Tensor  # float32 [1, T*hop]
    variant: str  # "stateful" | "windowed"
    sample_rate: int
    steps: list[Step]  # the chunk schedule that was run
    seconds: list[float]  # compute time per step (methods load on their first call)

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


def default_variant(variants: list[str]) -> str:
    """Stateful when shipped (it is exact against the offline decode), else windowed."""
    return "stateful" if "stateful" in variants else "windowed"


def decode(artifacts: str | Path | Artifacts, codes: Tensor, variant: str | None = None) -> Decoded:
    """codes int64 [1, Q, T] -> audio through the shipped programs, after re-hashing every file.

    Raises ArtifactError / ManifestError for a damaged directory, InputError for bad codes and
    ValueError for a variant the directory does not hold."""
    art = artifacts if isinstance(artifacts, Artifacts) else open_artifacts(artifacts)
    art.require_files()
    dec = art.decode
    variant = variant or default_variant(dec["variants"])
    if variant not in dec["variants"]:
        raise ValueError(f"{art.root} holds variant(s) {dec['variants']}, not {variant}")
    check_codes(codes, dec["num_quantizers"], dec["codebook_size"])
    run = art.programs().run
    if variant == "stateful":
        res = stream_stateful(run, art.initial_state(), codes, dec["hop"], dec["ramp"])
    else:
        res = stream_windowed(run, codes, dec["hop"], dec["context_frames"], dec["ramp"])
    return Decoded(res.wav, variant, dec["sample_rate"], res.steps, res.seconds)
