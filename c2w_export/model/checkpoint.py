"""Find, read and strictly load `<model>/speech_tokenizer/{config.json,model.safetensors}`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError, DecoderConfig
from .decoder import Code2Wav

PREFIX = "decoder."  # the decoder's keys in the tokenizer-level checkpoint
IGNORED_PREFIXES = ("encoder.",)  # the other half of the tokenizer; not ours to load
SUBDIR = "speech_tokenizer"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class CheckpointError(RuntimeError):
    """The checkpoint cannot be found, read or loaded strictly."""


@dataclass(frozen=True)
class CheckpointFiles:
    model: str  # what the user passed: a directory or a hub id
    config_path: Path
    weights_path: Path


def resolve(model: str | os.PathLike) -> CheckpointFiles:
    """A local directory (the model dir or its speech_tokenizer/ dir) or a hub id -> the two files."""
    model = str(model)
    local = Path(model).expanduser()
    if local.exists():
        for root in (local / SUBDIR, local):
            if (root / CONFIG_FILE).is_file() or (root / WEIGHTS_FILE).is_file():
                return _files(model, root)
        raise CheckpointError(
            f"{local} has no {SUBDIR}/{CONFIG_FILE} and {SUBDIR}/{WEIGHTS_FILE}. Pass the model directory "
            f"that contains {SUBDIR}/, a hub id, or make one with `c2w-export synth --out DIR`."
        )
    if not _HUB_ID.match(model):
        raise CheckpointError(f"{model!r} is neither an existing directory nor a hub id like 'Owner/Name'")
    return _files(model, Path(download(model)) / SUBDIR)


def download(repo_id: str) -> str:
    """Fetch only `speech_tokenizer/*` of a hub repo (never the 1+ GB talker) -> local snapshot dir."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, allow_patterns=[f"{SUBDIR}/*"])
    except Exception as e:  # the hub client raises many types; all mean "could not get it"
        raise CheckpointError(
            f"could not fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"Check the id and the network, or download {SUBDIR}/ elsewhere and pass the local directory."
        ) from None


def _files(model: str, root: Path) -> CheckpointFiles:
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (root / name).is_file():
            raise CheckpointError(f"missing file {root / name}: a checkpoint needs {SUBDIR}/{CONFIG_FILE} and {SUBDIR}/{WEIGHTS_FILE}")
    return CheckpointFiles(model, root / CONFIG_FILE, root / WEIGHTS_FILE)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; a damaged file raises CheckpointError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"cannot read {path}: {e} (truncated or not a safetensors file?)") from None


def read_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from a safetensors header, reading no tensor data."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"cannot read {path}: {e} (truncated or not a safetensors file?)") from None


def decoder_state_dict(tensors: dict, source: str) -> dict:
    """Keys under `decoder.` with the prefix stripped; encoder keys dropped; anything else is
    unexpected. The values (tensors or shapes) are passed through."""
    out, stray = {}, []
    for k, v in tensors.items():
        if k.startswith(PREFIX):
            out[k[len(PREFIX):]] = v
        elif not k.startswith(IGNORED_PREFIXES):
            stray.append(k)
    if stray:
        raise CheckpointError(f"{source}: unexpected key(s) outside '{PREFIX}' / encoder: {', '.join(sorted(stray)[:20])}")
    return out


def check_shapes(expected: dict[str, tuple], got: dict[str, tuple], source: str) -> None:
    """One CheckpointError, in one line, listing every missing key, unexpected key and shape mismatch."""
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    shapes = sorted(
        f"{k}: checkpoint {tuple(got[k])} vs model {tuple(expected[k])}"
        for k in set(expected) & set(got) if tuple(got[k]) != tuple(expected[k])
    )
    problems = []
    for title, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)):
        if items:
            shown = ", ".join(PREFIX + i for i in items[:20])
            more = f" (+{len(items) - 20} more)" if len(items) > 20 else ""
            problems.append(f"{len(items)} {title}: {shown}{more}")
    if problems:
        raise CheckpointError(f"{source} does not match the decoder config: " + "; ".join(problems))


def strict_load(decoder: Code2Wav, state: dict[str, torch.Tensor], source: str) -> None:
    """Load every parameter, after check_shapes."""
    expected = decoder.state_dict()
    check_shapes({k: v.shape for k, v in expected.items()}, {k: v.shape for k, v in state.items()}, source)
    decoder.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


def load_decoder(model: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Code2Wav:
    """A local dir or hub id -> eval-mode Code2Wav in `dtype`, loaded strictly.

    `decoder.checkpoint` records the files it came from."""
    files = resolve(model)
    try:
        cfg = DecoderConfig.from_json(files.config_path)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    try:
        with torch.device("meta"):  # the shapes the config implies, checked against the header before anything is allocated
            skeleton = Code2Wav(cfg)
    except Exception as e:  # a config the checks above let through that still builds no decoder: name it
        raise CheckpointError(f"{files.config_path}: no decoder can be built from it: {type(e).__name__}: {e}") from None
    check_shapes({k: v.shape for k, v in skeleton.state_dict().items()},
                 decoder_state_dict(read_shapes(files.weights_path), str(files.weights_path)), str(files.weights_path))
    state = decoder_state_dict(read_weights(files.weights_path), str(files.weights_path))
    decoder = Code2Wav(cfg).to(dtype)
    strict_load(decoder, state, str(files.weights_path))
    decoder.checkpoint = files
    return decoder.eval().requires_grad_(False)
