"""Our decoder on its own: causality, input errors, dtype handling."""

import pytest
import torch
from hypothesis import given, strategies as st

from c2w_export.model.validate import InputError
from c2w_export.program.compare import compare
from c2w_export.program.tolerances import tolerance
from helpers import cases, codes as random_codes, slice_tails


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
    """The history of a transposed conv holds the one input frame whose kernel overlaps the next
    chunk (K > S), none when K == S; more than one chunk of overlap (K > 2S) or a kernel shorter than
    its stride (K < S) is refused by name."""
    from c2w_export.model.layers import CausalConvTranspose1d

    if valid:
        conv = CausalConvTranspose1d(2, 3, kernel, stride)
        conv.state_name = "up"
        assert conv.state_shapes() == ({"up.history": (2, 1)} if kernel > stride else {})
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
    """(window decoded with context=72, the offline decode of the window's real frames: its last
    `chunk` frames), the window being 72 + chunk frames of which the last history + chunk are real."""
    codes = random_codes(decoder, 72 + chunk, seed)
    with torch.no_grad():
        cut, _ = decoder.step(codes, {}, first=torch.tensor([72 - history]), context=72)
        offline = decoder(codes[..., 72 - history:])
    return cut, offline[..., -chunk * decoder.config.hop:]


@pytest.mark.parametrize("frames,history", cases(WINDOW_CUTS))
def test_window_cut_to_the_frames_its_audio_depends_on(decoder64, frames, history):
    """A window decoded with `context` (the conv stack cut to `stack_frames(chunk)` before each layer,
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
    needs = decoder64.stack_frames(0)  # step reads the frames needed beyond the chunk's own
    for i in range(len(needs)):
        short = [n - (j == i) for j, n in enumerate(needs)]
        monkeypatch.setattr(decoder64, "stack_frames", lambda tail: [tail + n for n in short])
        d = compare(*_cut_and_offline(decoder64, 2, 72, 11))
        assert not d.within(tolerance("window_cut", "float64")), f"layer {i} cut to {short[i]} frames: {d.describe()}"


def test_window_cut_needs_an_empty_state(decoder):
    with pytest.raises(ValueError, match="without state"):
        decoder.step(random_codes(decoder, 3, 0), decoder.initial_state(), context=1)


def test_causal_conv_transpose_offline_is_torchs_conv_trimmed():
    """Offline (no history), our causal transposed conv is torch's own transposed conv with its
    bias, the last K-S samples trimmed (they belong to the next chunk)."""
    import torch.nn.functional as F

    from c2w_export.model.layers import causal_conv_transpose1d

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 3, 5, generator=g), torch.randn(3, 2, 8, generator=g), torch.randn(2, generator=g)
    y, _ = causal_conv_transpose1d(x, None, w, b, 4)
    full = F.conv_transpose1d(x, w, b, stride=4)
    assert torch.allclose(y, full[..., :20], atol=1e-6) and y.shape == (1, 2, 20)


@pytest.mark.parametrize("split", [1, 2, 4])
def test_causal_conv_transpose_chunked_is_offline(split):
    """Chunk by chunk, each carrying its input history, the causal transposed conv equals the
    offline one (fp64); the history is the chunk's last input frame."""
    from c2w_export.model.layers import causal_conv_transpose1d

    g = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(1, 3, 8, generator=g, dtype=torch.float64), torch.randn(3, 2, 8, generator=g, dtype=torch.float64),
               torch.randn(2, generator=g, dtype=torch.float64))
    offline, _ = causal_conv_transpose1d(x, None, w, b, 4)
    hist, pieces = torch.zeros(1, 3, 1, dtype=torch.float64), []
    for part in x.split(split, dim=-1):
        y, hist = causal_conv_transpose1d(part, hist, w, b, 4)
        pieces.append(y)
    assert torch.equal(hist, x[..., -1:])
    assert (torch.cat(pieces, -1) - offline).abs().max() < 1e-12


PHASE_CASES = [  # (id, kernel, stride): every shape CausalConvTranspose1d accepts
    ("kernel-twice-stride", 8, 4),  # the conv decoder's blocks (K = 2S)
    ("kernel-equals-stride", 2, 2),  # the latent upsampler
    ("kernel-between", 6, 4),
    ("kernel-odd", 5, 4),
]


def _by_phases_and_torch(kernel, stride, history, taps_swapped=False):
    """(prepare's causal conv of the output phases, torch's transposed conv of [history, x] cut to
    x's samples), float64; the history is one frame or None (a stream start)."""
    import torch.nn.functional as F

    from c2w_export.program.prepare import causal_conv_transpose1d_by_phases, phase_weight

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    w = torch.randn(3, 5, kernel, generator=g, dtype=torch.float64)
    h = -(-kernel // stride) - 1
    past = torch.randn(2, 3, h, generator=g, dtype=torch.float64) if history else torch.zeros(2, 3, h, dtype=torch.float64)
    phases = phase_weight(w, stride)
    got, new = causal_conv_transpose1d_by_phases(x, past if history else None, phases.flip(-1) if taps_swapped else phases,
                                                 None, stride)
    full = F.conv_transpose1d(torch.cat([past, x], -1), w, stride=stride)
    return got, full[..., h * stride: (h + 7) * stride], new


@pytest.mark.parametrize("history", [False, True], ids=["stream-start", "with-history"])
@pytest.mark.parametrize("kernel,stride", cases(PHASE_CASES))
def test_transposed_conv_by_phases_is_torchs_transposed_conv(kernel, stride, history):
    """prepare's causal conv of the output phases equals torch's own transposed conv of the
    history and the chunk, cut to the chunk's samples, in float64."""
    got, want, new = _by_phases_and_torch(kernel, stride, history)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-12)
    assert new.shape[-1] == -(-kernel // stride) - 1


def test_transposed_conv_by_phases_check_catches_taps_in_the_wrong_order():
    """The check above, on phase weights with their two taps swapped: far off."""
    got, want, _ = _by_phases_and_torch(8, 4, True, taps_swapped=True)
    assert (got - want).abs().max() > 0.1


# ---------------------------------------------------------------- state updates as a selection (prepare.LastFrames)
@given(m=st.integers(1, 8), k=st.integers(1, 5), g=st.integers(1, 4), n=st.integers(1, 3), t=st.integers(1, 6),
       half=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_last_frames_is_the_slice_bit_for_bit(m, k, g, n, t, half, seed):
    """LastFrames (a matmul with a 0/1 selection) keeps exactly the last m frames of [N, m + T*k, g],
    in float32 and float16: every kept value is bit for bit the slice's."""
    from c2w_export.program.prepare import LastFrames

    dtype = torch.float16 if half else torch.float32
    z = torch.randn(n, m + t * k, g, generator=torch.Generator().manual_seed(seed)).to(dtype)
    got = LastFrames(m, k).to(dtype)(z)
    assert got.shape == (n, m, g) and torch.equal(got, z[:, -m:])


def test_last_frames_check_catches_frames_in_the_wrong_order():
    """The check above on a selection whose identity block is rolled by one frame: not the slice."""
    from c2w_export.program.prepare import LastFrames

    frames = LastFrames(3, 2)
    frames.eye = frames.eye.roll(1, 0)
    z = torch.randn(2, 3 + 4 * 2, 5, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(frames(z), z[:, -3:])


def _rolled_selection(monkeypatch):
    """The deliberate bug: every LastFrames built with its identity block rolled by one frame."""
    from c2w_export.program import prepare as pp

    init = pp.LastFrames.__init__

    def rolled(self, m, k):
        init(self, m, k)
        self.eye = self.eye.roll(1, 0)

    monkeypatch.setattr(pp.LastFrames, "__init__", rolled)


SELECTIONS = [  # (id, a patch of prepare before it folds, whether the stream equals the slices')
    ("as-shipped", None, True),
    ("selection-rolled-one-frame", _rolled_selection, False),
]


@pytest.mark.parametrize("patch,equal", cases(SELECTIONS))
def test_prepared_state_updates_are_the_slices_bit_for_bit(decoder, monkeypatch, patch, equal):
    """A stream through the prepared stateful decoder (chunks 1..4): with its state updates taken
    by LastFrames, every output and state is bit for bit what the same decoder gives with them as
    slices (the model's own). On a selection rolled by one frame, it is not."""
    from c2w_export.program.prepare import prepare
    from c2w_export.program.variants import make_variant

    if patch:
        patch(monkeypatch)
    m = make_variant(prepare(decoder), "stateful", 4, 0)
    codes = random_codes(decoder, 14, 3)
    streams = []
    for sliced in (False, True):
        with monkeypatch.context() as p:
            if sliced:
                slice_tails(p)
            state, outs, at = list(m.initial_state()), [], 0
            for c in (1, 4, 2, 3, 4):
                out = m(codes[..., at:at + c], *state)
                outs += list(out)
                state, at = list(out[1:]), at + c
        streams.append(outs)
    assert all(torch.equal(a, b) for a, b in zip(*streams)) == equal
