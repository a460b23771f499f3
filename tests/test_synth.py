"""Synthetic checkpoints are non-degenerate. Every parity test is meaningless without this:
the decoder's default initialisation outputs exact zeros."""

import torch

from c2w_export.model.config import preset
from c2w_export.model.synth import make_decoder


def _decode_finite_causal(decoder):
    """Decode 50 random frames and again with frame 25 changed: the output is finite, depends on
    the codes and does not leak the future. Returns (codes, wav)."""
    g = torch.Generator().manual_seed(11)
    cfg = decoder.config
    a = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 50), generator=g)
    b = a.clone()
    b[:, :, 25] = (b[:, :, 25] + 1) % cfg.codebook_size
    with torch.no_grad():
        ya, yb = decoder(a), decoder(b)
    assert torch.isfinite(ya).all()
    assert float((ya - yb).abs().max()) > 1e-3, "output does not depend on the codes"
    assert float((ya[..., : 25 * cfg.hop] - yb[..., : 25 * cfg.hop]).abs().max()) == 0, "future frame leaked"
    return a, ya


def test_reference_output_is_non_degenerate(decoder):
    """On random codes: std in [0.02, 0.5], < 1% of samples clamped at +-1, no NaN, depends on codes."""
    _, ya = _decode_finite_causal(decoder)
    assert 0.02 <= float(ya.std()) <= 0.5, float(ya.std())
    assert float((ya.abs() >= 1.0).float().mean()) < 0.01


def test_seeded_and_reproducible():
    a = make_decoder(preset("tiny"), 5).state_dict()
    b = make_decoder(preset("tiny"), 5).state_dict()
    c = make_decoder(preset("tiny"), 6).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


# ---------------------------------------------------------------- stress checkpoints
def _pre_clamp(dec, codes):
    """The final conv's output (the waveform before the clamp)."""
    seen = {}
    h = dec.decoder[-1].register_forward_hook(lambda m, i, o: seen.__setitem__("y", o[0]))
    with torch.no_grad():
        dec(codes)
    h.remove()
    return seen["y"]


def test_stress_checkpoint_reaches_what_gaussian_weights_do_not(stress_decoder, decoder):
    """Each stress option measurably reaches its target, and the checkpoint stays non-degenerate
    where that applies (finite, depends on the codes, causal)."""
    from c2w_export.model.synth import DEAD_FRACTION

    a, _ = _decode_finite_causal(stress_decoder)
    # loud: a measured share of samples beyond +-1 before the clamp (plain checkpoint: none)
    beyond = float((_pre_clamp(stress_decoder, a).abs() > 1).float().mean())
    assert 0.05 < beyond < 0.3, beyond
    assert float((_pre_clamp(decoder, a).abs() > 1).float().mean()) < 0.01
    # dead codes: usage 0 on a quarter of every codebook, always on code 0 (the pad) and the last code
    for name, m in stress_decoder.named_modules():
        if name.endswith("_codebook"):
            dead = m.cluster_usage == 0
            assert dead[0] and dead[-1] and float(dead.float().mean()) >= DEAD_FRACTION, name
    # small: the first RMSNorm's input has a mean square of the order of its eps (measured 2.1e-5 vs 1e-5)
    seen = {}
    layer = stress_decoder.pre_transformer.layers[0].input_layernorm
    h = layer.register_forward_hook(lambda m, i, o: seen.__setitem__("x", i[0]))
    with torch.no_grad():
        stress_decoder(a)
    h.remove()
    assert float(seen["x"].pow(2).mean()) < 10 * layer.eps
    # outliers: a few output channels of the first conv carry x100 the typical weight norm
    norms = stress_decoder.decoder[0].conv.weight.flatten(1).norm(dim=1)
    assert int((norms > 20 * norms.median()).sum()) >= 2


def test_unknown_stress_option_is_refused():
    import pytest

    from c2w_export.model.synth import check_stress

    with pytest.raises(ValueError, match="unknown stress option"):
        check_stress(["loud", "quiet"])
