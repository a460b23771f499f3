"""Seeded, non-degenerate synthetic checkpoints in the real tokenizer layout.

The decoder's default initialisation outputs exact zeros (zero codebooks), which makes every parity
check pass vacuously. These weights are random at scales that keep activations O(1) through the
stack, and the final conv is calibrated so the pre-clamp output has std TARGET_STD on random codes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from .checkpoint import CONFIG_FILE, PREFIX, SUBDIR, WEIGHTS_FILE
from .config import DecoderConfig, preset
from .decoder import Code2Wav
from ..fileio import atomic_write_bytes

TARGET_STD = 0.15  # pre-clamp output std: inside the 0.02-0.5 band, far from the +-1 clamp
CALIBRATION_FRAMES = 12


def _fan_std(name: str, shape: torch.Size, module: torch.nn.Module) -> float:
    """1/sqrt(effective fan-in) for a weight, so each layer roughly preserves variance."""
    if isinstance(module, torch.nn.ConvTranspose1d):
        cin, _, k = shape
        return 1.0 / math.sqrt(cin * k / module.stride[0])
    fan_in = math.prod(shape[1:])
    return 1.0 / math.sqrt(fan_in)


def init_weights(decoder: Code2Wav, seed: int) -> None:
    """Fill every parameter from one seeded generator, in sorted-name order (reproducible)."""
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
    _calibrate(decoder, g)


def _calibrate(decoder: Code2Wav, g: torch.Generator) -> None:
    """Scale the final conv so the pre-clamp output std is TARGET_STD on random codes."""
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
        final.weight.mul_(TARGET_STD / max(std, 1e-12))
    handle.remove()


def make_decoder(cfg: DecoderConfig, seed: int) -> Code2Wav:
    decoder = Code2Wav(cfg)
    init_weights(decoder, seed)
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


def synth(preset_name: str, seed: int, out: str | os.PathLike) -> Path:
    """`c2w-export synth`: a seeded checkpoint of a preset config under `out`."""
    return write_checkpoint(make_decoder(preset(preset_name), seed), out)
