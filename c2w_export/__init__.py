"""c2w-export: export and parity-gate the Qwen3-TTS 12 Hz Code2Wav decoder.

The data path, one folder a step: `model/` (config, layers, decoder, checkpoints) -> `program/`
(variants, flows, pipeline, runners, streams, compare, tolerances) -> `ship/` (manifest, export,
bundles, verify, decode) -> `report/` (parity, benchmarks, golden), with `cli.py` on top.
"""

from .env import __version__
from .model.checkpoint import CheckpointError, load_decoder
from .model.config import ConfigError, DecoderConfig
from .model.decoder import Code2Wav
from .model.validate import InputError
from .ship.decode import Decoded, decode, open_stream

__all__ = ["Code2Wav", "CheckpointError", "ConfigError", "Decoded", "DecoderConfig", "InputError", "decode",
           "load_decoder", "open_stream", "__version__"]


def __getattr__(name: str):
    if name == "CodesError":  # the old name of InputError, kept so existing imports keep working
        import warnings

        warnings.warn("c2w_export.CodesError is InputError; import InputError", DeprecationWarning, stacklevel=2)
        return InputError
    raise AttributeError(f"module 'c2w_export' has no attribute {name!r}")
