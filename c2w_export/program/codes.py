"""Code windows used by parity checks: the patterns that shake out indexing and range bugs."""

from __future__ import annotations

import torch
from torch import Tensor

PATTERNS = ("uniform", "zeros", "max", "repeated", "hotspot")


def random_codes(q: int, t: int, codebook_size: int, seed: int) -> Tensor:
    """int64 [1, q, t], uniform over the codebook, reproducible from `seed`."""
    return torch.randint(0, codebook_size, (1, q, t), generator=torch.Generator().manual_seed(seed))


def code_window(pattern: str, q: int, t: int, codebook_size: int, seed: int) -> Tensor:
    """int64 [1, q, t] codes of a named pattern, reproducible from `seed`."""
    g = torch.Generator().manual_seed(seed)
    uniform = torch.randint(0, codebook_size, (1, q, t), generator=g)
    if pattern == "uniform":
        return uniform
    if pattern == "zeros":
        return torch.zeros(1, q, t, dtype=torch.int64)
    if pattern == "max":
        return torch.full((1, q, t), codebook_size - 1, dtype=torch.int64)
    if pattern == "repeated":  # runs of a repeated frame
        run = int(torch.randint(2, 6, (1,), generator=g))
        idx = torch.arange(t) // run
        return uniform[:, :, idx.clamp(max=t - 1)]
    if pattern == "hotspot":  # a constant window with one frame that differs
        base = torch.full((1, q, t), int(torch.randint(0, codebook_size, (1,), generator=g)), dtype=torch.int64)
        spot = int(torch.randint(0, t, (1,), generator=g))
        base[:, :, spot] = uniform[:, :, spot]
        return base
    raise ValueError(f"unknown code pattern {pattern!r}; choose from {PATTERNS}")


def check_windows(q: int, t: int, codebook_size: int, n: int, seed: int = 0) -> list[Tensor]:
    """n windows cycling through the patterns (uniform first)."""
    return [code_window(PATTERNS[i % len(PATTERNS)], q, t, codebook_size, seed + i) for i in range(n)]


def check_history(context: int, i: int, seed: int = 0) -> Tensor:
    """The windowed `history` input (int64 [1]) of check window i: a partial history first (the
    stream-start path, drawn from 1..context-1), then a full one, then none, in turn."""
    kind = i % 3
    if kind == 1:
        return torch.tensor([context], dtype=torch.int64)
    if kind == 2 or context <= 1:  # no partial history fits in a context of 0 or 1
        return torch.tensor([0], dtype=torch.int64)
    return torch.randint(1, context, (1,), generator=torch.Generator().manual_seed(seed + i))


def check_chunk(max_chunk: int, i: int, seed: int = 0) -> int:
    """The chunk size of check call i: the largest (what memory is planned for), then 1, then one
    drawn from 2..max_chunk-1, in turn."""
    kind = i % 3
    if kind == 0 or max_chunk <= 2:
        return max_chunk if kind != 1 else 1
    if kind == 1:
        return 1
    return int(torch.randint(2, max_chunk, (1,), generator=torch.Generator().manual_seed(seed + i)))
