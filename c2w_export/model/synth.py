"""Seeded, non-degenerate synthetic checkpoints in the real tokenizer layout.

The decoder's default initialisation outputs exact zeros (zero codebooks), which makes every parity
check pass vacuously. These weights are random at scales that keep activations O(1) through the
stack, and the final conv is calibrated so the pre-clamp output has std TARGET_STD on random codes.

Gaussian weights never reach some of the decoder's behaviour: the output clamp, the codebook-usage
clamp, RMSNorm's epsilon. Stress options (STRESS) change a seeded checkpoint so they matter:

- loud: pre-clamp std LOUD_STD, so ~10% of the samples lie beyond +-1 before the clamp;
- dead-codes: DEAD_FRACTION of every codebook (always code 0, the stream pad, and the last code)
  has cluster_usage 0, its embedding_sum scaled so the usage clamp sets its value;
- small: the transformer's input projection scaled by SMALL_SCALE, so the first RMSNorm sees a
  mean square of the order of its epsilon;
- outliers: OUTLIER_CHANNELS channels of the conv decoder's first conv and of the first upsampler
  multiplied by OUTLIER_GAIN.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Sequence

import torch

from .checkpoint import CONFIG_FILE, PREFIX, SUBDIR, WEIGHTS_FILE
from .config import DecoderConfig, preset
from .decoder import USAGE_FLOOR, Code2Wav
from ..fileio import atomic_write_bytes

TARGET_STD = 0.15  # pre-clamp output std: inside the 0.02-0.5 band, far from the +-1 clamp
CALIBRATION_FRAMES = 12

STRESS = ("loud", "dead-codes", "small", "outliers")
LOUD_STD = 0.6  # a Gaussian at std 0.6 lies beyond +-1 about 10% of the time
DEAD_FRACTION = 0.25  # of each codebook; uniform random codes hit a dead entry in 1 of 4 draws
SMALL_SCALE = 1e-3  # first RMSNorm input: mean square ~2e-5 (tiny), of the order of its eps 1e-5
OUTLIER_CHANNELS, OUTLIER_GAIN = 3, 100.0


def _fan_std(name: str, shape: torch.Size, module: torch.nn.Module) -> float:
    """1/sqrt(effective fan-in) for a weight, so each layer roughly preserves variance."""
    if isinstance(module, torch.nn.ConvTranspose1d):
        cin, _, k = shape
        return 1.0 / math.sqrt(cin * k / module.stride[0])
    fan_in = math.prod(shape[1:])
    return 1.0 / math.sqrt(fan_in)


def check_stress(stress: Sequence[str]) -> tuple[str, ...]:
    """The stress options in STRESS order; an unknown name raises ValueError naming it."""
    unknown = sorted(set(stress) - set(STRESS))
    if unknown:
        raise ValueError(f"unknown stress option(s) {unknown}; choose from {list(STRESS)}")
    return tuple(s for s in STRESS if s in stress)


def init_weights(decoder: Code2Wav, seed: int, stress: Sequence[str] = ()) -> None:
    """Fill every parameter from one seeded generator, in sorted-name order (reproducible), apply
    the stress options, then calibrate the output level."""
    g = torch.Generator().manual_seed(seed)
    modules = dict(decoder.named_modules())
    params = dict(decoder.named_parameters())
    cfg = decoder.config
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            owner = modules[name.rsplit(".", 1)[0]]
            leaf = name.rsplit(".", 1)[1]
            randn = torch.randn(p.shape, generator=g, dtype=torch.float64)
            rand = torch.rand(p.shape, generator=g, dtype=torch.float64)
            if leaf == "embedding_sum":
                value = randn
            elif leaf == "cluster_usage":
                value = 0.5 + 1.5 * rand
            elif leaf in ("alpha", "beta"):  # SnakeBeta logs
                value = 0.2 * randn
            elif leaf == "scale":  # transformer layer scales
                value = cfg.layer_scale_initial_scale * (0.5 + rand)
            elif leaf == "gamma":  # ConvNeXt scale
                value = 0.05 + 0.15 * rand
            elif leaf == "bias":
                value = 0.02 * randn
            elif isinstance(owner, (torch.nn.LayerNorm,)) or name.endswith(("norm.weight", "layernorm.weight")):
                value = 1.0 + 0.05 * randn
            else:
                value = randn * _fan_std(name, p.shape, owner)
                if ".conv2." in name:  # keep residual units from doubling the variance each time
                    value = value * 0.3
            p.copy_(value.to(p.dtype))
        stress = check_stress(stress)
        if "dead-codes" in stress:
            _kill_codes(decoder, g)
        if "small" in stress:
            decoder.pre_transformer.input_proj.weight.mul_(SMALL_SCALE)
            decoder.pre_transformer.input_proj.bias.mul_(SMALL_SCALE)
        if "outliers" in stress:
            _outliers(decoder, g)
    _calibrate(decoder, g, LOUD_STD if "loud" in stress else TARGET_STD)


def _kill_codes(decoder: Code2Wav, g: torch.Generator) -> None:
    """usage 0 on DEAD_FRACTION of each codebook (codes 0 and size-1 always); embedding_sum scaled
    by the usage clamp, so with the clamp a dead code's vector has the usual O(1) scale."""
    for name, cb in decoder.named_modules():
        if name.endswith("_codebook"):
            n = cb.cluster_usage.shape[0]
            dead = torch.randperm(n, generator=g)[: int(DEAD_FRACTION * n)]
            dead = torch.cat([dead, torch.tensor([0, n - 1])]).unique()
            cb.cluster_usage[dead] = 0.0
            cb.embedding_sum[dead] *= USAGE_FLOOR


def _outliers(decoder: Code2Wav, g: torch.Generator) -> None:
    """OUTLIER_GAIN on a few output channels of the first conv-decoder conv and first upsampler."""
    first = decoder.decoder[0].conv.weight  # [Cout, Cin, K]
    up = decoder.upsample[0][0].conv.weight  # transposed conv: [Cin, Cout, K]
    first[torch.randperm(first.shape[0], generator=g)[:OUTLIER_CHANNELS]] *= OUTLIER_GAIN
    up[:, torch.randperm(up.shape[1], generator=g)[:OUTLIER_CHANNELS]] *= OUTLIER_GAIN


def _calibrate(decoder: Code2Wav, g: torch.Generator, target_std: float) -> None:
    """Scale the final conv so the pre-clamp output std is `target_std` on random codes."""
    cfg = decoder.config
    last = decoder.decoder[-1]  # CausalConv1d: returns (y, new_state)
    final = last.conv
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, CALIBRATION_FRAMES), generator=g)
    captured = {}
    handle = last.register_forward_hook(lambda m, i, o: captured.__setitem__("y", o[0]))
    with torch.no_grad():
        final.bias.zero_()
        decoder(codes)
        std = float(captured["y"].std())
        final.weight.mul_(target_std / max(std, 1e-12))
    handle.remove()


def make_decoder(cfg: DecoderConfig, seed: int, stress: Sequence[str] = ()) -> Code2Wav:
    decoder = Code2Wav(cfg)
    init_weights(decoder, seed, stress)
    return decoder.eval().requires_grad_(False)


def write_checkpoint(decoder: Code2Wav, out: str | os.PathLike) -> Path:
    """Write `out/speech_tokenizer/{config.json,model.safetensors}` (keys prefixed `decoder.`),
    each file atomically. Returns the speech_tokenizer directory."""
    from safetensors.torch import save

    root = Path(out) / SUBDIR
    root.mkdir(parents=True, exist_ok=True)
    tensors = {PREFIX + k: v.detach().contiguous().to(torch.float32) for k, v in decoder.state_dict().items()}
    atomic_write_bytes(root / WEIGHTS_FILE, save(tensors, metadata={"format": "pt"}))
    atomic_write_bytes(root / CONFIG_FILE, json.dumps(decoder.config.to_tokenizer_dict(), indent=2).encode())
    return root


def synth(preset_name: str, seed: int, out: str | os.PathLike, stress: Sequence[str] = ()) -> Path:
    """`c2w-export synth`: a seeded checkpoint of a preset config under `out`."""
    return write_checkpoint(make_decoder(preset(preset_name), seed, stress), out)
