"""The upstream qwen-tts 12 Hz decoder as an oracle, loaded without importing `qwen_tts`.

`import qwen_tts` runs its package __init__, which needs librosa/gradio. We find the installed
package on disk and register `core/tokenizer_12hz` as a package of its own. The oracle is part of
the gate (tox -e parity installs it) and of the conformance checks when it is installed; it is never
a dependency of c2w_export.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import torch
from torch import Tensor

PACKAGE = "_qwen_tts_tokenizer_12hz"
INSTALL = "pip install --no-deps qwen-tts==0.1.1 transformers==4.57.3 (tox -e parity does)"


def _load_package():
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the upstream oracle qwen-tts is not installed: {INSTALL}")
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


def upstream_decoder(tokenizer_config: dict, state_dict: dict, attn_implementation: str = "eager"):
    """The upstream Qwen3TTSTokenizerV2Decoder with these weights; eval mode, float32."""
    pkg = _load_package()
    cfg_mod, model_mod = pkg.configuration_qwen3_tts_tokenizer_v2, pkg.modeling_qwen3_tts_tokenizer_v2
    dec_cfg = cfg_mod.Qwen3TTSTokenizerV2DecoderConfig(**tokenizer_config["decoder_config"])
    dec_cfg._attn_implementation = attn_implementation
    model = model_mod.Qwen3TTSTokenizerV2Decoder(dec_cfg)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise AssertionError(f"upstream decoder keys differ from ours: missing={missing} unexpected={unexpected}")
    return model.eval().requires_grad_(False)


class Oracle:
    """Upstream's decode of our decoder's weights: `offline(codes)` -> [1, T*hop]; `window(codes,
    context, history)` -> the audio of the frames after the first `context`, as a windowed program
    gives it."""

    def __init__(self, decoder, attn_implementation: str = "eager"):
        self.hop = decoder.config.hop
        self.model = upstream_decoder(decoder.config.to_tokenizer_dict(),
                                      {k: v.detach().clone() for k, v in decoder.state_dict().items()},
                                      attn_implementation)

    def offline(self, codes: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model(codes)[:, 0]

    def window(self, codes: torch.Tensor, context: int, history: int | None = None) -> torch.Tensor:
        """What a windowed program gives for (codes, history): upstream's offline decode of the
        window without its absent frames (the first context - history), after the history."""
        history = context if history is None else history
        return self.offline(codes[:, :, context - history:])[:, history * self.hop:]

    def variant(self, variant: str, context: int) -> "OracleVariant":
        """Upstream as a variant module (check_method's reference): see OracleVariant."""
        return OracleVariant(self, variant, context)


class OracleVariant:
    """Upstream's decode called like a variant module: windowed (codes, history) -> wav of the
    window's last frames; stateful (codes, seen) -> (wav of the new frames, seen + codes), its state
    being the codes so far (upstream has no streaming state: each call decodes the whole stream)."""

    def __init__(self, oracle: Oracle, variant: str, context: int):
        self.oracle, self.variant, self.context = oracle, variant, context

    def initial_state(self) -> tuple[Tensor, ...]:
        return () if self.variant == "windowed" else (torch.zeros(1, 0, 0, dtype=torch.int64),)

    def __call__(self, codes: Tensor, *rest: Tensor):
        if self.variant == "windowed":
            return self.oracle.window(codes, self.context, int(rest[0]))
        seen = codes if rest[0].numel() == 0 else torch.cat([rest[0], codes], dim=-1)
        return self.oracle.offline(seen)[:, -codes.shape[-1] * self.oracle.hop:], seen
