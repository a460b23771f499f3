"""The one compare helper: max abs diff, where it is, and SNR, computed in float64."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .tolerances import Tolerance


@dataclass(frozen=True)
class Diff:
    max_abs: float  # max |actual - reference|
    index: tuple[int, ...]  # where max_abs occurs
    snr_db: float  # 10 log10(sum ref^2 / sum err^2); inf when identical
    mean_abs: float
    numel: int

    def within(self, tol: Tolerance) -> bool:
        """Both bounds hold: max_abs <= tol.max_abs and snr_db >= tol.min_snr_db. A non-finite
        output (max_abs inf) never passes, whatever the tolerance."""
        return math.isfinite(self.max_abs) and self.max_abs <= tol.max_abs and self.snr_db >= tol.min_snr_db

    def describe(self) -> str:
        snr = f"{self.snr_db:.1f}" if math.isfinite(self.snr_db) else ("inf" if self.snr_db > 0 else "-inf")
        return f"max_abs={self.max_abs:.3g} at {self.index}, SNR={snr} dB, mean_abs={self.mean_abs:.3g}"

    def to_json(self) -> dict:
        return {"max_abs": self.max_abs, "index": list(self.index),
                "snr_db": None if math.isinf(self.snr_db) else self.snr_db, "mean_abs": self.mean_abs}


def compare(actual: Tensor, reference: Tensor) -> Diff:
    """Error statistics of `actual` against `reference` (same shape). NaN anywhere gives
    max_abs=inf at the first NaN, so it can never pass a tolerance."""
    if actual.shape != reference.shape:
        raise ValueError(f"shape mismatch: actual {tuple(actual.shape)} vs reference {tuple(reference.shape)}")
    a, r = actual.detach().to(torch.float64), reference.detach().to(torch.float64)
    err = (a - r).abs()
    bad = ~torch.isfinite(err)
    if bad.any():
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        return Diff(math.inf, idx, -math.inf, math.inf, err.numel())
    flat = int(err.argmax()) if err.numel() else 0
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape)) if err.numel() else ()
    noise = float((err ** 2).sum())
    signal = float((r ** 2).sum())
    snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal > 0 else -math.inf)
    return Diff(float(err.max()) if err.numel() else 0.0, idx, snr, float(err.mean()) if err.numel() else 0.0, err.numel())


def combine(diffs: list[Diff]) -> Diff:
    """Worst max_abs and worst SNR over several comparisons (index of the worst max_abs)."""
    worst = max(diffs, key=lambda d: d.max_abs)
    return Diff(worst.max_abs, worst.index, min(d.snr_db for d in diffs),
                max(d.mean_abs for d in diffs), sum(d.numel for d in diffs))
