"""Reference parity: our decoder and the upstream qwen-tts decoder load the same safetensors and
agree (tox -e reference). Upstream is a test-only oracle, loaded by file path."""

import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors.torch import load_file

from c2w_export import load_decoder
from c2w_export.model.checkpoint import decoder_state_dict
from c2w_export.program.compare import compare
from c2w_export.program.tolerances import tolerance

from upstream import upstream_decoder

ATTN = ("eager", "sdpa")


def _pair(model_dir, attn):
    ours = load_decoder(model_dir)
    files = ours.checkpoint
    import json

    upstream = upstream_decoder(json.loads(files.config_path.read_text()),
                                decoder_state_dict(load_file(files.weights_path), "ckpt"), attn)
    return ours, upstream


@pytest.fixture(scope="module", params=ATTN, ids=[f"upstream-{a}" for a in ATTN])
def tiny_pair(request, model_dir):
    return _pair(model_dir, request.param)


def _codes(cfg, pattern, t, seed):
    if pattern == "zeros":
        return torch.zeros(1, cfg.num_quantizers, t, dtype=torch.int64)
    if pattern == "max":
        return torch.full((1, cfg.num_quantizers, t), cfg.codebook_size - 1, dtype=torch.int64)
    return torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, t), generator=torch.Generator().manual_seed(seed))


def _lengths(cfg):
    w = cfg.sliding_window
    return [1, 2, 25, w - 1, w, w + 1, 3 * w + 7]


def _check(pair, pattern, t, seed=0):
    ours, upstream = pair
    codes = _codes(ours.config, pattern, t, seed)
    with torch.no_grad():
        a, b = ours(codes), upstream(codes)
    assert a.shape == b.shape == (1, 1, t * ours.config.hop)
    if pattern == "uniform":
        assert float(b.std()) > 0.02, "reference output is degenerate: the parity check would be vacuous"
    d = compare(a, b)
    assert d.within(tolerance("reference")), f"{pattern} T={t}: {d.describe()}"


@pytest.mark.parametrize("pattern", ["uniform", "zeros", "max"])
@pytest.mark.parametrize("length_index", range(7), ids=["T1", "T2", "T25", "Wm1", "W", "Wp1", "3Wp7"])
def test_tiny_matches_upstream(tiny_pair, pattern, length_index):
    _check(tiny_pair, pattern, _lengths(tiny_pair[0].config)[length_index])


@settings(max_examples=10, deadline=None)
@given(t=st.integers(1, 120), seed=st.integers(0, 2**16))
def test_tiny_matches_upstream_drawn_length(tiny_pair, t, seed):
    _check(tiny_pair, "uniform", t, seed)


@pytest.fixture(scope="module", params=ATTN, ids=[f"upstream-{a}" for a in ATTN])
def real_pair(request, real_model_dir):
    return _pair(real_model_dir, request.param)


@pytest.mark.real
@pytest.mark.parametrize("pattern", ["uniform", "zeros", "max"])
def test_real_size_matches_upstream(real_pair, pattern):
    cfg = real_pair[0].config
    lengths = _lengths(cfg) if pattern == "uniform" else [1, cfg.sliding_window + 1]
    for t in lengths:
        _check(real_pair, pattern, t)


def test_upstream_keys_equal_ours(tiny_pair):
    ours, upstream = tiny_pair
    assert set(ours.state_dict()) == set(upstream.state_dict())
