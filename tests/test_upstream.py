"""Reference parity: our decoder and the upstream qwen-tts decoder load the same safetensors and
agree: tiny and the stress checkpoint in tox -e parity, real size (--real) in tox -e reference.
Upstream is a test-only oracle, loaded by file path (tests/upstream.py)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors.torch import load_file

from c2w_export import load_decoder
from c2w_export.model.checkpoint import decoder_state_dict
from c2w_export.program.codes import code_window
from c2w_export.program.compare import compare
from c2w_export.program.tolerances import tolerance
from c2w_export.conformance.upstream import Oracle, upstream_decoder

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
    return code_window(pattern, cfg.num_quantizers, t, cfg.codebook_size, seed)


def _lengths(cfg):
    w = cfg.sliding_window
    return [1, 2, 25, w - 1, w, w + 1, 3 * w + 7]


def _check(pair, pattern, t, seed=0, decoded=None):
    """Our decode against upstream's on one code window; `decoded` {(pattern, t, seed): ours' output}
    keeps our decode for the next upstream attention (at real size each decode is seconds)."""
    ours, upstream = pair
    codes = _codes(ours.config, pattern, t, seed)
    decoded = {} if decoded is None else decoded
    with torch.no_grad():
        if (pattern, t, seed) not in decoded:
            decoded[(pattern, t, seed)] = ours(codes)
        a, b = decoded[(pattern, t, seed)], upstream(codes)
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


@pytest.fixture(scope="module")
def real_decoded():
    """Our real-size decodes by (pattern, frames, seed), made once for both upstream attentions (the two
    pairs load the same checkpoint)."""
    return {}


@pytest.mark.real
@pytest.mark.parametrize("pattern", ["uniform", "zeros", "max"])
def test_real_size_matches_upstream(real_pair, pattern, real_decoded):
    cfg = real_pair[0].config
    lengths = _lengths(cfg) if pattern == "uniform" else [1, cfg.sliding_window + 1]
    for t in lengths:
        _check(real_pair, pattern, t, decoded=real_decoded)


def test_upstream_keys_equal_ours(tiny_pair):
    ours, upstream = tiny_pair
    assert set(ours.state_dict()) == set(upstream.state_dict())


@pytest.mark.parametrize("pattern", ["uniform", "zeros", "max"])
def test_stress_checkpoint_matches_upstream(stress_decoder, pattern):
    """Loud output, dead codes (0 and the last code are dead), small activations, outlier channels:
    our decoder and upstream agree where Gaussian weights never go."""
    oracle = Oracle(stress_decoder)
    c = _codes(stress_decoder.config, pattern, 3 * stress_decoder.config.sliding_window + 7, 5)
    with torch.no_grad():
        d = compare(stress_decoder(c)[:, 0], oracle.offline(c))
    assert d.within(tolerance("stress")), f"{pattern}: {d.describe()}"


@pytest.mark.real
def test_real_xnnpack_stateful_stream_vs_upstream(real_model_dir, context, tmp_path):
    """Real size in CI (tox -e reference): the stateful XNNPACK program (one method, chunks 1..25)
    through the production build (every stage gated against eager at chunks 25, 1 and one drawn
    between), then a whole stream of irregular chunk sizes through it, its state fed back across
    the sliding window, against upstream's offline decode."""
    from c2w_export.program.streaming import StreamDecoder
    from helpers import ProgramCache, initial_state

    decoder = load_decoder(real_model_dir)
    programs = ProgramCache(decoder, 25, context, tmp_path)
    (result,) = programs.get("executorch_xnnpack", "stateful")[0].values()
    print(f"real XNNPACK {result.spec.method} vs eager: {result.diff.describe()}; {result.delegation}")
    assert result.passed, result.failure()
    sizes = [1, 3, 25, 2, 7, 25, 13]  # a talker's irregular chunks, each decoded as it arrives
    frames = sum(sizes)
    assert frames > decoder.config.sliding_window
    codes = _codes(decoder.config, "uniform", frames, 11)
    dec = StreamDecoder(programs.runner("executorch_xnnpack", "stateful").run, "stateful", decoder.config.hop, [25],
                        state=initial_state(decoder))
    pieces, pos = [], 0
    for n in sizes:
        pieces += dec.push(codes[:, :, pos:pos + n])
        pos += n
    pieces += dec.finish()
    assert [s.frames for s in dec.steps] == sizes
    d = compare(torch.cat(pieces, -1), Oracle(decoder).offline(codes))
    print(f"real XNNPACK stateful stream (chunks {sizes}, {frames} frames) vs upstream: {d.describe()}")
    assert d.within(tolerance("stateful_stream")), d.describe()
