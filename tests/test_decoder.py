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


@pytest.mark.parametrize("bias_shape", ["flat", "folded"])
def test_causal_conv_transpose_offline_is_torchs_conv_trimmed(bias_shape):
    """Offline (no carry), our causal transposed conv is torch's own transposed conv with its bias,
    the last K-S samples trimmed; the bias may come as [Cout] or folded as [1, Cout, 1] (prepare)."""
    import torch.nn.functional as F

    from c2w_export.model.layers import causal_conv_transpose1d

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 3, 5, generator=g), torch.randn(3, 2, 8, generator=g), torch.randn(2, generator=g)
    y, carry = causal_conv_transpose1d(x, None, w, b if bias_shape == "flat" else b[None, :, None], 4)
    full = F.conv_transpose1d(x, w, b, stride=4)
    assert torch.allclose(y, full[..., :20], atol=1e-6) and y.shape == (1, 2, 20)
    assert torch.allclose(carry, full[..., 20:] - b[None, :, None], atol=1e-6)  # the tail, bias taken out
