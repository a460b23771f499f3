"""Our decoder on its own: causality, input errors, dtype handling."""

import pytest
import torch
from hypothesis import given, strategies as st

from c2w_export.model.validate import InputError
from c2w_export.program.compare import compare
from c2w_export.program.tolerances import tolerance
from helpers import cases, codes as random_codes


def test_output_shape_and_dtype(decoder):
    cfg = decoder.config
    y = decoder(torch.zeros(1, cfg.num_quantizers, 3, dtype=torch.int64))
    assert y.shape == (1, 1, 3 * cfg.hop) and y.dtype == torch.float32


@given(n=st.integers(1, 30), extra=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_causal_prefix(decoder, n, extra, seed):
    """Decoding the first N frames equals the first N*hop samples of a longer decode."""
    cfg = decoder.config
    codes = random_codes(decoder, n + extra, seed)
    with torch.no_grad():
        full, prefix = decoder(codes), decoder(codes[:, :, :n])
    d = compare(prefix, full[..., : n * cfg.hop])
    assert d.within(tolerance("eager_resized")), d.describe()


def _codes(decoder, **kw):
    cfg = decoder.config
    shape = kw.pop("shape", (1, cfg.num_quantizers, 4))
    return torch.zeros(shape, dtype=kw.pop("dtype", torch.int64))


BAD_CODES = [
    ("int32", lambda d: _codes(d, dtype=torch.int32), "must be int64"),
    ("float", lambda d: _codes(d, dtype=torch.float32), "must be int64"),
    ("2d", lambda d: _codes(d, shape=(16, 4)), "3 dims"),
    ("batch2", lambda d: _codes(d, shape=(2, 16, 4)), "batch must be 1"),
    ("wrong-q", lambda d: _codes(d, shape=(1, 15, 4)), "Q=16"),
    ("empty-t", lambda d: _codes(d, shape=(1, 16, 0)), "T >= 1"),
    ("too-big", lambda d: _codes(d).index_fill_(2, torch.tensor([2]), d.config.codebook_size), r"found 2048 at index \(0, 0, 2\)"),
    ("negative", lambda d: _codes(d).index_fill_(2, torch.tensor([1]), -1), "found -1"),
    ("not-tensor", lambda d: [[0]], "torch.Tensor"),
]


@pytest.mark.parametrize("make,message", cases(BAD_CODES))
def test_bad_codes_raise_value_error(decoder, make, message):
    with pytest.raises(InputError, match=message) as e:
        decoder(make(decoder))
    assert isinstance(e.value, ValueError)



def test_check_codes_holds_a_program_to_its_frame_count(decoder):
    decoder.check_codes(_codes(decoder), frames=4)
    with pytest.raises(InputError, match=r"^codes must have T=5 frames for this program, got shape \(1, 16, 4\)$"):
        decoder.check_codes(_codes(decoder), frames=5)


TRANSPOSED_SHAPES = [  # (id, kernel, stride, valid): kernel == stride, or stride < kernel <= 2*stride
    ("k-eq-s", 4, 4, True),
    ("overlap-half", 6, 4, True),
    ("k-eq-2s", 8, 4, True),
    ("k-below-s", 3, 4, False),
    ("k-above-2s", 9, 4, False),
]


@pytest.mark.parametrize("kernel,stride,valid", cases(TRANSPOSED_SHAPES))
def test_transposed_conv_shapes(kernel, stride, valid):
    """The carry of a transposed conv holds its overlap K-S with the next chunk; more than one
    chunk of overlap (K > 2S) or none to carry the bias (K < S) is refused by name."""
    from c2w_export.model.layers import CausalConvTranspose1d

    if valid:
        conv = CausalConvTranspose1d(2, 3, kernel, stride)
        conv.state_name = "up"
        assert conv.state_shapes() == ({"up.carry": (3, kernel - stride)} if kernel > stride else {})
        return
    with pytest.raises(ValueError, match=rf"^transposed conv needs kernel == stride or stride < kernel <= 2\*stride, "
                                         rf"got {kernel}, {stride}$"):
        CausalConvTranspose1d(2, 3, kernel, stride)

def test_fp64_agrees_with_fp32(model_dir, decoder):
    """fp64 is the noise floor reference: fp32 should sit within float noise of it."""
    from c2w_export import load_decoder

    d64 = load_decoder(model_dir, dtype=torch.float64)
    codes = random_codes(decoder, 30, 0)
    with torch.no_grad():
        d = compare(decoder(codes), d64(codes))
    assert d.max_abs < 1e-5 and d.snr_db > 95, d.describe()


@given(t=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_offline_equals_one_step_from_the_zero_state(decoder, t, seed):
    """Two code paths that must agree: the stateless offline decode (zero padding, no K/V cache)
    and one streaming step from initial_state() (zero history and masked zero keys)."""
    codes = random_codes(decoder, t, seed)
    with torch.no_grad():
        offline = decoder(codes)
        stepped, new = decoder.step(codes, decoder.initial_state())
    d = compare(offline, stepped)
    assert d.within(tolerance("eager_resized")), d.describe()
    assert set(new) == {n for n, _, _ in decoder.state_spec()}


WINDOW_CUTS = [  # (id, chunk, real history frames) of a window with a 72-frame context
    ("chunk1-no-history", 1, 0), ("chunk2-partial-history", 2, 3), ("chunk25-full-history", 25, 72),
]


@pytest.fixture(scope="module")
def decoder64(model_dir):
    """The tiny decoder in fp64: its noise (~1e-15) is far below what one frame too few moves."""
    from c2w_export import load_decoder

    return load_decoder(model_dir, dtype=torch.float64)


def _cut_and_offline(decoder, chunk, history, seed):
    """(window decoded with tail=chunk, the offline decode of the window's real frames: its last
    `chunk` frames), the window being 72 + chunk frames of which the last history + chunk are real."""
    codes = random_codes(decoder, 72 + chunk, seed)
    with torch.no_grad():
        cut, _ = decoder.step(codes, {}, first=torch.tensor([72 - history]), tail=chunk)
        offline = decoder(codes[..., 72 - history:])
    return cut, offline[..., -chunk * decoder.config.hop:]


@pytest.mark.parametrize("frames,history", cases(WINDOW_CUTS))
def test_window_cut_to_the_frames_its_audio_depends_on(decoder64, frames, history):
    """A window decoded with `tail` (the conv stack cut to `stack_frames(tail)` before each layer,
    as the windowed programs run) against the offline decode of the window's real frames (no cut,
    no absent frames), in fp64. The cut is real: the stack's first layer sees fewer frames than the
    window holds."""
    cut, offline = _cut_and_offline(decoder64, frames, history, 7 + frames)
    assert cut.shape == offline.shape == (1, 1, frames * decoder64.config.hop)
    d = compare(cut, offline)
    assert d.within(tolerance("window_cut", "float64")), d.describe()
    assert decoder64.stack_frames(frames)[0] < 72 + frames


def test_window_cut_one_frame_short_anywhere_fails(decoder64, monkeypatch):
    """The gate above on a deliberate bug: one frame fewer before any one layer of the stack (a
    reach off by one) moves the chunk's audio beyond it (full history: every cut frame is real)."""
    needs = decoder64.stack_frames(2)
    for i in range(len(needs)):
        short = [n - (j == i) for j, n in enumerate(needs)]
        monkeypatch.setattr(decoder64, "stack_frames", lambda tail: short)
        d = compare(*_cut_and_offline(decoder64, 2, 72, 11))
        assert not d.within(tolerance("window_cut", "float64")), f"layer {i} cut to {short[i]} frames: {d.describe()}"


def test_window_cut_needs_an_empty_state(decoder):
    with pytest.raises(ValueError, match="without state"):
        decoder.step(random_codes(decoder, 3, 0), decoder.initial_state(), tail=1)


@pytest.mark.parametrize("bias_shape", ["flat", "folded"])
def test_causal_conv_transpose_offline_is_torchs_conv_trimmed(bias_shape):
    """Offline (no carry), our causal transposed conv is torch's own transposed conv with its bias,
    the last K-S samples trimmed; the bias may come as [Cout] or folded as [1, Cout, 1] (prepare)."""
    import torch.nn.functional as F

    from c2w_export.model.layers import overlap_add

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 3, 5, generator=g), torch.randn(3, 2, 8, generator=g), torch.randn(2, generator=g)
    y, carry = overlap_add(F.conv_transpose1d(x, w, stride=4), None, b if bias_shape == "flat" else b[None, :, None], 20)
    full = F.conv_transpose1d(x, w, b, stride=4)
    assert torch.allclose(y, full[..., :20], atol=1e-6) and y.shape == (1, 2, 20)
    assert torch.allclose(carry, full[..., 20:] - b[None, :, None], atol=1e-6)  # the tail, bias taken out


PHASE_CASES = [  # (id, kernel, stride): every shape CausalConvTranspose1d accepts
    ("kernel-twice-stride", 8, 4),  # the conv decoder's blocks (K = 2S)
    ("kernel-equals-stride", 2, 2),  # the latent upsampler
    ("kernel-between", 6, 4),
    ("kernel-odd", 5, 4),
]


@pytest.mark.parametrize("kernel,stride", cases(PHASE_CASES))
def test_transposed_conv_by_phases_is_torchs_transposed_conv(kernel, stride):
    """prepare's conv of the output phases equals torch's own transposed conv, in float64."""
    import torch.nn.functional as F

    from c2w_export.program.prepare import conv_transpose1d_by_phases, phase_weight

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    w = torch.randn(3, 5, kernel, generator=g, dtype=torch.float64)
    full = F.conv_transpose1d(x, w, stride=stride)
    got = conv_transpose1d_by_phases(x, phase_weight(w, stride), stride, kernel)
    assert got.shape == full.shape and torch.allclose(got, full, atol=1e-12)


def test_transposed_conv_by_phases_check_catches_taps_in_the_wrong_order():
    """The check above, on phase weights with their two taps swapped: far off."""
    import torch.nn.functional as F

    from c2w_export.program.prepare import conv_transpose1d_by_phases, phase_weight

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 3, 7, generator=g, dtype=torch.float64), torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    got = conv_transpose1d_by_phases(x, phase_weight(w, 4).flip(-1), 4, 8)
    assert (got - F.conv_transpose1d(x, w, stride=4)).abs().max() > 0.1
