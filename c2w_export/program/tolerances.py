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

STRESS_GATE = Tolerance(
    1.5e-4, 90.0,
    "every comparison on the combined stress checkpoint (synth --stress all: std 0.59, 17% of samples "
    "beyond +-1 before the clamp, small transformer activations, x100 outlier channels): fp32 vs fp64 "
    "measured 5.0e-5 / 100.2 dB on tiny, the louder output and the outlier channels scale the rounding "
    "noise; 3x margin. What the stress checkpoint exists to catch is far above it: dropping RMSNorm's "
    "eps moves it 2.0 (6 dB), dropping the usage clamp gives inf",
)

# name -> tolerance. A flow's name keys the gate its programs are held to against their reference
# (artifact flows: the fp32 eager decoder; the eager flow: the fp64 decode).
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("reference", "float32"): Tolerance(
        1e-5, 95.0,
        "ours vs upstream qwen-tts on the same safetensors: measured 0 to 3.4e-6 (sdpa, real size); "
        "identical math, only op order differs",
    ),
    ("eager", "float32"): FP32_GATE,  # vs the fp64 decode: measured 1.5e-6 to 2.5e-6 / 114-115 dB on tiny
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
    ("stress", "float32"): STRESS_GATE,
    ("torch_export", "float32"): FP32_GATE,
    ("executorch_xnnpack", "float32"): FP32_GATE,
    ("executorch_portable", "float32"): FP32_GATE,
    # Whole streams through a stateful program vs the offline eager decode: the same math in a
    # different grouping (conv history, K/V cache); prototype measured ~1e-5 / ~100 dB at real size.
    ("stateful_stream", "float32"): FP32_GATE,
    # Windowed streams vs the offline decode. The first `context` frames (a window short of history
    # marks its pad absent, program/streaming.py) are held to the flow's own gate: exact by
    # construction, measured 1.7e-6 / 117 dB eager on tiny. After them, when the context covers the
    # decoder's receptive field (decoder.receptive_frames: ~26 frames on tiny, ~580 at real size)
    # the steady state is exact up to fp32 noise.
    ("windowed_steady_exact", "float32"): FP32_GATE,
    # Otherwise attention chained over layers reaches past the context: real size at context 72
    # measured 61.9 dB (chunk 2) and 70.6 dB (chunk 25), 7.6e-4 max abs. The floor still fails a
    # window built one frame off (~0 dB) or a wrong history (the offline reference is independent
    # of the window builder).
    ("windowed_steady_approx", "float32"): Tolerance(
        0.05, 40.0, "context shorter than the receptive field: measured 62-72 dB / 7.6e-4 at real size, context 72",
    ),
    ("bfloat16", "bfloat16"): Tolerance(1.0, 20.0, "bf16 measured ~25 dB at real size; SNR gate only"),
    ("float16", "float16"): Tolerance(1.0, 38.0, "fp16 autocast measured ~43 dB at real size; SNR gate only"),
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
