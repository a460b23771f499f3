"""The one tolerance table. Each entry states why it has its value and what was measured.

Scale of real bugs (real-size config, measured on this machine): one changed code moves the
output ~0.58; a 1e-3 relative change of a single transformer o_proj weight moves it ~6.5e-5
(~93 dB). fp32 vs fp64 noise is ~7e-6 max abs (~104 dB). So fp32 gates sit at a few 1e-5 max abs
plus an SNR floor of 95 dB, between the noise and the smallest bug we want to see.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    max_abs: float
    min_snr_db: float
    why: str

    def to_json(self) -> dict:
        return {"max_abs": self.max_abs, "min_snr_db": self.min_snr_db, "why": self.why}


FP32_GATE = Tolerance(
    3e-5, 95.0,
    "fp32 reordering noise: ~3e-6 (ours vs upstream), ~1e-5 at real size for XNNPACK; a 1e-3 "
    "o_proj perturbation moves the output 6.5e-5 / 93 dB and must fail",
)

# (flow, dtype) -> tolerance against the eager decoder on the same input.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("reference", "float32"): Tolerance(
        1e-5, 95.0,
        "ours vs upstream qwen-tts on the same safetensors: measured 0 to 3.4e-6 (sdpa, real size); "
        "identical math, only op order differs",
    ),
    ("eager", "float32"): Tolerance(
        1e-6, 120.0, "eager vs eager (windowed slice of a full decode, repeat runs): identical ops, measured 0",
    ),
    ("eager_resized", "float32"): Tolerance(
        1e-5, 100.0,
        "eager vs eager on a different length (causal prefix, windowed slice): oneDNN blocks convs and "
        "matmuls differently per shape; measured ~2e-6 on tiny",
    ),
    ("golden", "float32"): Tolerance(
        3e-5, 95.0,
        "committed golden audio vs today's decode: torch/oneDNN/XNNPACK upgrades reorder fp32 math "
        "(same noise scale as the flow gates); a real numerics change is far larger",
    ),
    ("torch_export", "float32"): FP32_GATE,
    ("executorch_xnnpack", "float32"): FP32_GATE,
    ("executorch_portable", "float32"): FP32_GATE,
    # Whole streams through a stateful program vs the offline eager decode: the same math in a
    # different grouping (conv history, K/V cache); prototype measured ~1e-5 / ~100 dB at real size.
    ("stateful_stream", "float32"): FP32_GATE,
    ("bfloat16", "bfloat16"): Tolerance(1.0, 20.0, "bf16 measured ~25 dB at real size; SNR gate only"),
    ("float16", "float16"): Tolerance(1.0, 38.0, "fp16 autocast measured ~43 dB at real size; SNR gate only"),
}

# Windowed (stateless) streams vs the offline decode are *not* exact: attention chained over
# layers reaches further back than the context. These floors track what the design gives up.
# The tiny config (window 8, 2 layers, reach ~26 frames) is exact at context 72 once history
# exists; at stream start the missing history is padded (see streaming.py), which costs accuracy
# in the first `context` frames. Real size measured ~57 dB (chunk 25) / ~45 dB (chunk 2).
WINDOWED_STREAM_FLOOR_DB: dict[str, float] = {
    "tiny": 95.0,  # steady state exact up to fp32 noise
    "real": 40.0,  # measured 45-57 dB with random weights
}

# Bundled vectors of stateful methods also compare the new state, with one (rtol, atol) for all
# outputs (the bundled API has no per-output tolerance). State tensors reach ~10 in magnitude
# (pre-activation conv history); XNNPACK measured up to 8.7e-5 abs there. Measured on tiny: the
# second chained vector fails at rtol 2e-5 and passes at 1e-4. The strict fp32 gate stays in
# verify's own window and stream checks; this is the on-device self-check.
BUNDLE_STATE_RTOL = 1e-4

PERTURBATION = 1e-3  # relative change of one weight that a gate must reject


def tolerance(flow: str, dtype: str = "float32") -> Tolerance:
    try:
        return TOLERANCES[(flow, dtype)]
    except KeyError:
        raise KeyError(f"no tolerance for flow={flow!r} dtype={dtype!r}; add one to c2w_export/tolerances.py") from None
