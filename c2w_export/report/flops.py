"""FLOPs per second of audio, counted by torch.utils.flop_counter.FlopCounterMode."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..program.variants import example_inputs


def count_flops(module, inputs) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(*inputs)
    return int(counter.get_total_flops())


def flops_per_audio_second(module) -> float:
    """FLOPs one call at the largest chunk costs, divided by the seconds of audio it produces."""
    cfg = module.decoder.config
    seconds = module.max_chunk * cfg.hop / cfg.output_sample_rate
    return count_flops(module, example_inputs(module)) / seconds


def offline_flops_per_audio_second(decoder, frames: int = 100) -> float:
    cfg = decoder.config
    codes = torch.zeros(1, cfg.num_quantizers, frames, dtype=torch.int64)
    return count_flops(decoder, (codes,)) / (frames * cfg.hop / cfg.output_sample_rate)
