"""Load the upstream qwen-tts 12 Hz decoder as a test-only oracle, without importing `qwen_tts`.

`import qwen_tts` runs its package __init__, which needs torchaudio/gradio. We find the installed
package on disk and register `core/tokenizer_12hz` as a package of its own.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

PACKAGE = "_qwen_tts_tokenizer_12hz"


def _load_package():
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("qwen-tts is not installed; run `tox -e reference`")
    root = Path(list(spec.submodule_search_locations)[0]) / "core" / "tokenizer_12hz"
    # An empty package of our own: the 12 Hz modules import each other relatively.
    pkg_spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    pkg_spec.submodule_search_locations = [str(root)]
    pkg = importlib.util.module_from_spec(pkg_spec)
    sys.modules[PACKAGE] = pkg
    for name in ("configuration_qwen3_tts_tokenizer_v2", "modeling_qwen3_tts_tokenizer_v2"):
        mspec = importlib.util.spec_from_file_location(f"{PACKAGE}.{name}", root / f"{name}.py")
        module = importlib.util.module_from_spec(mspec)
        sys.modules[mspec.name] = module
        mspec.loader.exec_module(module)
        setattr(pkg, name, module)
    return pkg


def upstream_decoder(tokenizer_config: dict, state_dict: dict, attn_implementation: str):
    """The upstream Qwen3TTSTokenizerV2Decoder with our weights; eval mode, float32."""
    pkg = _load_package()
    cfg_mod, model_mod = pkg.configuration_qwen3_tts_tokenizer_v2, pkg.modeling_qwen3_tts_tokenizer_v2
    dec_cfg = cfg_mod.Qwen3TTSTokenizerV2DecoderConfig(**tokenizer_config["decoder_config"])
    dec_cfg._attn_implementation = attn_implementation
    model = model_mod.Qwen3TTSTokenizerV2Decoder(dec_cfg)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise AssertionError(f"upstream decoder keys differ from ours: missing={missing} unexpected={unexpected}")
    return model.eval().requires_grad_(False)
