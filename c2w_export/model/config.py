"""The decoder's configuration: one frozen dataclass parsed from `speech_tokenizer/config.json`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..fileio import read_json


class ConfigError(ValueError):
    """config.json is missing, unreadable or describes an impossible decoder."""


@dataclass(frozen=True)
class DecoderConfig:
    codebook_size: int  # entries per RVQ codebook
    codebook_dim: int  # channels of the summed RVQ output (each half-codebook holds codebook_dim // 2)
    latent_dim: int  # channels between pre_conv, transformer projections and the upsampler
    decoder_dim: int  # channels of the first conv-decoder stage; halved by each upsample stage
    hidden_size: int  # transformer width
    intermediate_size: int  # SwiGLU hidden width
    num_attention_heads: int
    num_key_value_heads: int  # < heads means grouped-query attention
    num_hidden_layers: int
    num_quantizers: int  # 1 semantic + (num_quantizers - 1) acoustic codebooks
    sliding_window: int  # a query at frame p attends to keys p-(W-1)..p
    upsample_rates: tuple[int, ...]  # conv-decoder transposed-conv strides
    upsampling_ratios: tuple[int, ...]  # latent upsampler strides (before the conv decoder)
    head_dim: int = 0  # 0 in the file means hidden_size // num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01  # only used by the synthetic-checkpoint generator
    max_position_embeddings: int = 8000
    attention_bias: bool = False
    hidden_act: str = "silu"
    output_sample_rate: int = 24000  # top level of config.json
    decode_upsample_rate: int = 1920  # top level of config.json: samples per code frame

    REQUIRED = (
        "codebook_size", "codebook_dim", "latent_dim", "decoder_dim", "hidden_size",
        "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
        "num_quantizers", "sliding_window", "upsample_rates", "upsampling_ratios",
    )

    def __post_init__(self) -> None:
        _validate(self)

    # Sizes derived from the config, named once.
    @property
    def hop(self) -> int:
        """Output samples per code frame."""
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)

    @property
    def kv_cache_frames(self) -> int:
        """Frames of K/V a streaming step must remember: the window minus the current frame."""
        return self.sliding_window - 1

    @classmethod
    def from_dict(cls, tokenizer_config: Mapping[str, Any], source: str = "config") -> "DecoderConfig":
        """Parse a tokenizer-level config dict (with `decoder_config` inside)."""
        if not isinstance(tokenizer_config, Mapping):
            raise ConfigError(f"{source}: expected a JSON object at the top level")
        dec = tokenizer_config.get("decoder_config")
        if not isinstance(dec, Mapping):
            raise ConfigError(f"{source}: missing required object 'decoder_config'")
        missing = [k for k in cls.REQUIRED if k not in dec]
        if missing:
            raise ConfigError(f"{source}: decoder_config is missing required field(s): {', '.join(missing)}")
        if dec.get("rope_scaling") not in (None, {}) and (dec["rope_scaling"] or {}).get(
            "rope_type", dec["rope_scaling"].get("type")
        ) not in (None, "default"):
            raise ConfigError(f"{source}: only default RoPE is supported, got rope_scaling={dec['rope_scaling']}")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {k: v for k, v in dec.items() if k in known}
        for top in ("output_sample_rate", "decode_upsample_rate"):
            if top in tokenizer_config:
                kwargs[top] = tokenizer_config[top]
        if kwargs.get("head_dim") is None:
            kwargs["head_dim"] = 0
        for k in ("upsample_rates", "upsampling_ratios"):
            if isinstance(kwargs[k], list):
                kwargs[k] = tuple(kwargs[k])
        try:
            return cls(**kwargs)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> "DecoderConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        return cls.from_dict(read_json(path, ConfigError), source=str(path))

    def to_tokenizer_dict(self) -> dict[str, Any]:
        """The tokenizer-level config.json layout this config came from."""
        dec = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        top = {k: dec.pop(k) for k in ("output_sample_rate", "decode_upsample_rate")}
        dec["upsample_rates"] = list(self.upsample_rates)
        dec["upsampling_ratios"] = list(self.upsampling_ratios)
        return {"model_type": "qwen3_tts_tokenizer_12hz", **top, "decoder_config": dec}

    def canonical_sha256(self) -> str:
        """sha256 of the canonical (sorted, resolved head_dim) JSON of this config."""
        d = self.to_tokenizer_dict()
        return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


MAX_FLOAT = 3.4028234663852886e38  # float32's largest: the parameters these initialise are float32
MAX_INT = 2 ** 31 - 1  # a size past this is no decoder's (and overflows the kernels' int32 indexing)
_POSITIVE_INTS = (
    "codebook_size", "codebook_dim", "latent_dim", "decoder_dim", "hidden_size", "intermediate_size",
    "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "num_quantizers",
    "sliding_window", "max_position_embeddings", "output_sample_rate", "decode_upsample_rate",
)


def _validate(c: DecoderConfig) -> None:
    for name in _POSITIVE_INTS:
        v = getattr(c, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{name} must be an integer, got {v!r}")
        if not 0 < v <= MAX_INT:
            raise ConfigError(f"{name} must be in 1..{MAX_INT}, got {v}")
    for name in ("upsample_rates", "upsampling_ratios"):
        v = getattr(c, name)
        if not isinstance(v, tuple) or not v or any(isinstance(r, bool) or not isinstance(r, int) or not 0 < r <= MAX_INT
                                                    for r in v):
            raise ConfigError(f"{name} must be a non-empty list of positive integers, got {v!r}")
    if isinstance(c.head_dim, bool) or not isinstance(c.head_dim, int) or not 0 <= c.head_dim <= MAX_INT:
        raise ConfigError(f"head_dim must be a positive integer, got {c.head_dim!r}")
    if c.head_dim == 0:
        if c.hidden_size % c.num_attention_heads:
            raise ConfigError(
                f"hidden_size {c.hidden_size} is not divisible by num_attention_heads "
                f"{c.num_attention_heads} and no head_dim is given"
            )
        object.__setattr__(c, "head_dim", c.hidden_size // c.num_attention_heads)
    if c.head_dim % 2:
        raise ConfigError(f"head_dim must be even for RoPE, got {c.head_dim}")
    if c.num_attention_heads % c.num_key_value_heads:
        raise ConfigError(
            f"num_attention_heads {c.num_attention_heads} is not a multiple of num_key_value_heads {c.num_key_value_heads}"
        )
    if c.num_quantizers < 2:
        raise ConfigError(f"num_quantizers must be >= 2 (1 semantic + acoustic), got {c.num_quantizers}")
    if c.codebook_dim % 2:
        raise ConfigError(f"codebook_dim must be even (split RVQ halves), got {c.codebook_dim}")
    if c.sliding_window < 2:
        raise ConfigError(f"sliding_window must be >= 2, got {c.sliding_window}")
    if c.decoder_dim % (2 ** len(c.upsample_rates)):
        raise ConfigError(
            f"decoder_dim {c.decoder_dim} must be divisible by 2**len(upsample_rates) = {2 ** len(c.upsample_rates)}"
        )
    if c.hop != c.decode_upsample_rate:
        raise ConfigError(
            f"prod(upsample_rates + upsampling_ratios) = {c.hop} disagrees with decode_upsample_rate "
            f"{c.decode_upsample_rate}"
        )
    if c.hidden_act != "silu":
        raise ConfigError(f"hidden_act {c.hidden_act!r} is not supported (only 'silu')")
    for name in ("rope_theta", "rms_norm_eps", "layer_scale_initial_scale"):
        v = getattr(c, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_FLOAT:
            raise ConfigError(f"{name} must be a positive number up to {MAX_FLOAT:.4g}, got {v!r}")
    if not isinstance(c.attention_bias, bool):
        raise ConfigError(f"attention_bias must be true or false, got {c.attention_bias!r}")


PRESETS: dict[str, dict[str, Any]] = {
    # The published Qwen3-TTS 12 Hz tokenizer decoder_config.
    "real": dict(
        codebook_size=2048, codebook_dim=512, latent_dim=1024, decoder_dim=1536, hidden_size=512,
        intermediate_size=1024, head_dim=64, num_attention_heads=16, num_key_value_heads=16,
        num_hidden_layers=8, num_quantizers=16, sliding_window=72, rope_theta=10000.0,
        rms_norm_eps=1e-5, layer_scale_initial_scale=0.01, upsample_rates=(8, 5, 4, 3),
        upsampling_ratios=(2, 2),
    ),
    # Same hop (1920), rates and 16 quantizers; small widths; window 8 so short streams cross it;
    # 2 kv heads exercise grouped-query attention.
    "tiny": dict(
        codebook_size=2048, codebook_dim=16, latent_dim=32, decoder_dim=64, hidden_size=32,
        intermediate_size=64, head_dim=8, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, num_quantizers=16, sliding_window=8, rope_theta=10000.0,
        rms_norm_eps=1e-5, layer_scale_initial_scale=0.1, upsample_rates=(8, 5, 4, 3),
        upsampling_ratios=(2, 2),
    ),
}


def preset(name: str) -> DecoderConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return DecoderConfig(**PRESETS[name])
