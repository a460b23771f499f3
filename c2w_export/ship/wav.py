"""Codes files in, WAV files out."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import torch

from ..fileio import atomic_write_bytes
from ..model.validate import InputError


MAX_CODE_ELEMENTS = 16 * 1_000_000  # 16 codebooks x a million frames (~22 hours of audio at 12.5 Hz)


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a .npy header claims, read without reading the array."""
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    return tuple(shape), dtype


def read_codes(path: str | Path) -> torch.Tensor:
    """.npy or .pt holding int64 [Q, T] or [1, Q, T] -> int64 [1, Q, T] (shape/range checked later).
    A file that claims (.npy header) or holds (.pt size) more than MAX_CODE_ELEMENTS codes is refused
    before anything that size is allocated."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"codes file not found: {path}")
    if path.stat().st_size == 0:
        raise InputError(f"codes file is empty: {path}")
    if path.suffix == ".pt" and path.stat().st_size > MAX_CODE_ELEMENTS * 8 + (1 << 20):
        raise InputError(f"codes file {path} is {path.stat().st_size} bytes, over the limit of {MAX_CODE_ELEMENTS} "
                         f"int64 codes")
    try:
        if path.suffix == ".npy":
            shape, _ = _npy_header(path)
            if math.prod(shape) > MAX_CODE_ELEMENTS:
                raise InputError(f"codes file {path} claims shape {list(shape)}, over the limit of "
                                 f"{MAX_CODE_ELEMENTS} codes")
            arr = np.load(path, allow_pickle=False)
            codes = torch.from_numpy(np.ascontiguousarray(arr))
        elif path.suffix == ".pt":
            codes = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise InputError(f"codes file must be .npy or .pt, got {path.name}")
    except InputError:
        raise
    except Exception as e:
        why = str(e).split("WeightsUnpickler error:")[-1].strip().splitlines()  # torch's pickle refusal: its reason
        raise InputError(f"cannot read codes from {path}: {type(e).__name__}: {why[0] if why else ''}") from None
    if not isinstance(codes, torch.Tensor):
        raise InputError(f"{path} must hold a single tensor, got {type(codes).__name__}")
    if codes.dtype != torch.int64:
        raise InputError(f"codes in {path} must be int64, got {str(codes.dtype).removeprefix('torch.')}")
    if codes.ndim == 2:
        codes = codes[None]
    if codes.ndim != 3 or codes.shape[0] != 1:
        raise InputError(f"codes in {path} must have shape [Q, T] or [1, Q, T], got {list(codes.shape)}")
    return codes


WAV_FORMATS = ("pcm16", "float32")


def write_wav(path: str | Path, wav: torch.Tensor, sample_rate: int, fmt: str = "pcm16") -> None:
    """float [..., N] in [-1, 1] -> mono WAV: 16-bit PCM (default) or 32-bit IEEE float (the
    decoder's samples bit for bit). Written to a temporary file and moved into place."""
    if fmt not in WAV_FORMATS:
        raise ValueError(f"unknown WAV format {fmt!r}; choose from {WAV_FORMATS}")
    samples = wav.detach().reshape(-1).to(torch.float32).numpy()
    if fmt == "pcm16":
        data = (samples.clip(-1, 1) * 32767.0).round().astype("<i2").tobytes()
    else:
        data = samples.astype("<f4").tobytes()
    atomic_write_bytes(Path(path), _wav_bytes(data, sample_rate, fmt))


def _wav_bytes(data: bytes, sample_rate: int, fmt: str) -> bytes:
    """A RIFF/WAVE file: format tag 1 (PCM, 16 bit) or 3 (IEEE float, 32 bit, with the fact chunk
    that non-PCM formats carry)."""
    tag, width = (1, 2) if fmt == "pcm16" else (3, 4)
    fmt_chunk = struct.pack("<HHIIHH", tag, 1, sample_rate, sample_rate * width, width, 8 * width)
    if tag == 3:
        fmt_chunk += struct.pack("<H", 0)  # cbSize
    chunks = b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk
    if tag == 3:
        chunks += b"fact" + struct.pack("<II", 4, len(data) // width)
    chunks += b"data" + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks
