"""c2w-export: export and parity-gate the Qwen3-TTS 12 Hz Code2Wav decoder."""

from .checkpoint import CheckpointError, load_decoder
from .config import ConfigError, DecoderConfig
from .decoder import Code2Wav, CodesError

__version__ = "0.1.0"
__all__ = ["Code2Wav", "CheckpointError", "CodesError", "ConfigError", "DecoderConfig", "load_decoder", "__version__"]
