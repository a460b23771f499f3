"""Hypothesis strategies: code windows of the patterns that shake out bugs, chunk sizes, seeds."""

from hypothesis import strategies as st

from c2w_export.codes import PATTERNS, code_window

seeds = st.integers(min_value=0, max_value=2**31 - 1)
patterns = st.sampled_from(PATTERNS)


def chunks(ramp):
    return st.sampled_from(list(ramp))


@st.composite
def code_windows(draw, q: int, t: int, codebook_size: int):
    """int64 [1, q, t]: uniform, all 0, all codebook_size-1, repeated-frame runs, or one hot spot."""
    return code_window(draw(patterns), q, t, codebook_size, draw(seeds))


def ramps(max_chunk: int = 25):
    """Ramp schedules: sorted distinct chunk sizes."""
    return st.lists(st.integers(1, max_chunk), min_size=1, max_size=5, unique=True).map(sorted)
