"""Hypothesis strategies for codec codes, shared by the conformance suite and this repo's tests."""

from __future__ import annotations

from hypothesis import strategies as st

from ..program.codes import PATTERNS, code_window

seeds = st.integers(min_value=0, max_value=2**31 - 1)
patterns = st.sampled_from(PATTERNS)


@st.composite
def code_windows(draw, q: int, t: int, codebook_size: int):
    """int64 [1, q, t]: uniform, all 0, all codebook_size-1, repeated-frame runs, or one hot spot."""
    return code_window(draw(patterns), q, t, codebook_size, draw(seeds))
