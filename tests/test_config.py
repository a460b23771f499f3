"""Config parsing: every bad config.json gets an error naming the field."""

import json

import pytest

from c2w_export.model.config import PRESETS, ConfigError, DecoderConfig, preset
from helpers import cases


def tokenizer_dict(**decoder_overrides):
    d = preset("tiny").to_tokenizer_dict()
    d["decoder_config"].update(decoder_overrides)
    return d


def without(key):
    d = preset("tiny").to_tokenizer_dict()
    del d["decoder_config"][key]
    return d


BAD = [
    ("missing-codebook_size", without("codebook_size"), "missing required field(s): codebook_size"),
    ("missing-sliding_window", without("sliding_window"), "sliding_window"),
    ("no-decoder_config", {"output_sample_rate": 24000}, "decoder_config"),
    ("zero-hidden", tokenizer_dict(hidden_size=0), "hidden_size must be in 1..2147483647, got 0"),
    ("negative-layers", tokenizer_dict(num_hidden_layers=-1), "num_hidden_layers must be in 1..2147483647, got -1"),
    ("string-size", tokenizer_dict(latent_dim="32"), "latent_dim must be an integer"),
    ("heads-not-dividing", tokenizer_dict(hidden_size=30, head_dim=None), "not divisible by num_attention_heads"),
    ("bad-rates", tokenizer_dict(upsample_rates=[8, 0, 4, 3]), "upsample_rates"),
    ("hop-disagrees", {**tokenizer_dict(), "decode_upsample_rate": 960}, "disagrees with decode_upsample_rate"),
    ("gqa-bad", tokenizer_dict(num_key_value_heads=3), "not a multiple of num_key_value_heads"),
    ("act", tokenizer_dict(hidden_act="gelu"), "hidden_act"),
    ("rope-scaling", tokenizer_dict(rope_scaling={"rope_type": "yarn"}), "default RoPE"),
]


@pytest.mark.parametrize("data,message", cases(BAD))
def test_bad_config_is_named(data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DecoderConfig.from_dict(data)


def test_head_dim_defaults_to_hidden_over_heads():
    cfg = DecoderConfig.from_dict(tokenizer_dict(head_dim=None))
    assert cfg.head_dim == cfg.hidden_size // cfg.num_attention_heads


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_json(name, tmp_path):
    cfg = preset(name)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_tokenizer_dict()))
    again = DecoderConfig.from_json(tmp_path / "config.json")
    assert again == cfg and again.hop == 1920


def test_real_preset_is_the_published_config():
    c = preset("real")
    assert (c.latent_dim, c.codebook_dim, c.codebook_size, c.decoder_dim, c.hidden_size, c.intermediate_size) == (
        1024, 512, 2048, 1536, 512, 1024)
    assert (c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.num_hidden_layers, c.num_quantizers) == (
        64, 16, 16, 8, 16)
    assert (c.sliding_window, c.rope_theta, c.rms_norm_eps, c.layer_scale_initial_scale) == (72, 10000, 1e-5, 0.01)
    assert c.upsample_rates == (8, 5, 4, 3) and c.upsampling_ratios == (2, 2)


def test_not_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        DecoderConfig.from_json(tmp_path / "config.json")
