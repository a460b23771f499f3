"""Codes files in, WAV files out."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import torch

from ..model.validate import InputError


def read_codes(path: str | Path) -> torch.Tensor:
    """.npy or .pt holding int64 [Q, T] or [1, Q, T] -> int64 [1, Q, T] (shape/range checked later)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"codes file not found: {path}")
    if path.stat().st_size == 0:
        raise InputError(f"codes file is empty: {path}")
    try:
        if path.suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
            codes = torch.from_numpy(np.ascontiguousarray(arr))
        elif path.suffix == ".pt":
            codes = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise InputError(f"codes file must be .npy or .pt, got {path.name}")
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"cannot read codes from {path}: {type(e).__name__}: {e}") from None
    if not isinstance(codes, torch.Tensor):
        raise InputError(f"{path} must hold a single tensor, got {type(codes).__name__}")
    if codes.dtype != torch.int64:
        raise InputError(f"codes in {path} must be int64, got {str(codes.dtype).removeprefix('torch.')}")
    if codes.ndim == 2:
        codes = codes[None]
    if codes.ndim != 3 or codes.shape[0] != 1:
        raise InputError(f"codes in {path} must have shape [Q, T] or [1, Q, T], got {list(codes.shape)}")
    return codes


def write_wav(path: str | Path, wav: torch.Tensor, sample_rate: int) -> None:
    """float [..., N] in [-1, 1] -> 16-bit mono PCM WAV."""
    pcm = (wav.detach().reshape(-1).clamp(-1, 1).numpy() * 32767.0).round().astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())
