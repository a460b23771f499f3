"""Checkpoint loading is strict and every failure names what is wrong."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from c2w_export import CheckpointError, load_decoder
from c2w_export.model import checkpoint as ck
from helpers import cases


@pytest.fixture
def ckpt(model_dir, tmp_path):
    """A private copy of the session checkpoint to damage."""
    src = ck.resolve(model_dir)
    dst = tmp_path / "model" / "speech_tokenizer"
    dst.mkdir(parents=True)
    shutil.copy(src.config_path, dst / "config.json")
    shutil.copy(src.weights_path, dst / "model.safetensors")
    return tmp_path / "model"


def _edit_weights(root, edit):
    path = root / "speech_tokenizer" / "model.safetensors"
    t = load_file(path)
    edit(t)
    save_file(t, path)


def test_loads_strictly_and_equal(ckpt, decoder):
    d = load_decoder(ckpt)
    assert not d.training
    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), decoder.state_dict().values()))


def test_accepts_speech_tokenizer_dir_and_ignores_encoder(ckpt):
    _edit_weights(ckpt, lambda t: t.__setitem__("encoder.some.weight", torch.zeros(2)))
    load_decoder(ckpt / "speech_tokenizer")


DAMAGE = [
    ("missing-key", lambda t: t.pop("decoder.pre_conv.conv.weight"), "1 missing keys: decoder.pre_conv.conv.weight"),
    ("extra-key", lambda t: t.__setitem__("decoder.bogus.weight", torch.zeros(1)), "1 unexpected keys: decoder.bogus.weight"),
    ("wrong-shape", lambda t: t.__setitem__("decoder.pre_conv.conv.bias", torch.zeros(3)),
     r"decoder.pre_conv.conv.bias: checkpoint \(3,\)"),
    ("stray-prefix", lambda t: t.__setitem__("talker.w", torch.zeros(1)), "unexpected key.*talker.w"),
]


@pytest.mark.parametrize("edit,message", cases(DAMAGE))
def test_damaged_state_dict(ckpt, edit, message):
    _edit_weights(ckpt, edit)
    with pytest.raises(CheckpointError, match=message):
        load_decoder(ckpt)


def test_all_problems_in_one_error(ckpt):
    def edit(t):
        t.pop("decoder.pre_conv.conv.weight")
        t["decoder.extra"] = torch.zeros(1)
    _edit_weights(ckpt, edit)
    with pytest.raises(CheckpointError, match="(?s)missing keys.*unexpected keys"):
        load_decoder(ckpt)


def test_truncated_safetensors(ckpt):
    path = ckpt / "speech_tokenizer" / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cannot read .*model.safetensors.*truncated"):
        load_decoder(ckpt)


def test_broken_config_json(ckpt):
    (ckpt / "speech_tokenizer" / "config.json").write_text('{"decoder_config": ')
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_decoder(ckpt)


def test_config_missing_field(ckpt):
    p = ckpt / "speech_tokenizer" / "config.json"
    d = json.loads(p.read_text())
    del d["decoder_config"]["latent_dim"]
    p.write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="missing required field.*latent_dim"):
        load_decoder(ckpt)


def test_missing_weights_file(ckpt):
    (ckpt / "speech_tokenizer" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing file .*model.safetensors"):
        load_decoder(ckpt)


def test_empty_directory_says_what_to_do(tmp_path):
    with pytest.raises(CheckpointError, match="c2w-export synth"):
        load_decoder(tmp_path)


def test_hub_id_downloads_only_speech_tokenizer(monkeypatch, ckpt):
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns=None, **kw):
        calls.append((repo_id, allow_patterns))
        return str(ckpt)

    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    load_decoder("Qwen/Qwen3-TTS-12Hz-Fake")
    assert calls == [("Qwen/Qwen3-TTS-12Hz-Fake", ["speech_tokenizer/*"])]


def test_unreachable_hub_has_a_clear_message(monkeypatch):
    import huggingface_hub

    def offline(*a, **k):
        raise OSError("Network is unreachable")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError, match="could not fetch 'Owner/Model' from the Hugging Face hub.*local directory"):
        load_decoder("Owner/Model")
