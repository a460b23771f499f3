"""Golden numerics: a small committed set (tests/golden/tiny_seed0.npz) from the deterministic tiny
seed-0 synthetic checkpoint, to track numerics across torch / ExecuTorch upgrades.

It holds the codes, a strided subset of the expected offline audio, per-frame RMS and summary
statistics. Updating is deliberate (`c2w-export golden --update`), never done by tests.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from ..program.compare import compare
from ..fileio import atomic_write_bytes
from ..program.tolerances import tolerance

GOLDEN_FILE = "tiny_seed0.npz"
FRAMES, CODES_SEED, STRIDE = 40, 20261202, 37


def default_dir() -> Path:
    return Path.cwd() / "tests" / "golden"


def golden_decoder():
    from ..model.config import preset
    from ..model.synth import make_decoder

    return make_decoder(preset("tiny"), 0)


def golden_codes(cfg) -> torch.Tensor:
    g = torch.Generator().manual_seed(CODES_SEED)
    return torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, FRAMES), generator=g)


def summarize(wav: torch.Tensor, hop: int) -> dict[str, np.ndarray]:
    """wav [1, T*hop] -> the stored fields."""
    w = wav.detach().to(torch.float64).reshape(-1)
    return {
        "samples": w[::STRIDE].numpy().astype(np.float32),
        "frame_rms": w.reshape(-1, hop).pow(2).mean(-1).sqrt().numpy(),
        "stats": np.array([float(w.mean()), float(w.std()), float(w.abs().max())]),
    }


def load_golden(directory: Path | None = None) -> dict[str, np.ndarray]:
    path = (directory or default_dir()) / GOLDEN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"golden set {path} not found; create it with `c2w-export golden --update`")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def drift(golden: dict[str, np.ndarray], wav: torch.Tensor, hop: int) -> dict[str, float]:
    """Max abs change per stored field of `wav` against the golden set."""
    now = summarize(wav, hop)
    return {k: float(np.abs(now[k].astype(np.float64) - golden[k].astype(np.float64)).max()) for k in now}


def check_wav(golden: dict[str, np.ndarray], wav: torch.Tensor, hop: int, flow: str) -> tuple[bool, str]:
    tol = tolerance("golden")
    d = compare(torch.from_numpy(summarize(wav, hop)["samples"]), torch.from_numpy(golden["samples"]))
    per_field = drift(golden, wav, hop)
    ok = d.within(tol) and all(v <= tol.max_abs for v in per_field.values())
    text = (f"{flow}: drift vs golden {d.describe()}; per field "
            + ", ".join(f"{k} {v:.3g}" for k, v in per_field.items())
            + f" (tolerance {tol.max_abs:g})")
    return ok, text


def check_golden(directory: Path | None = None) -> tuple[bool, str]:
    """Eager offline decode against the committed golden set."""
    golden = load_golden(directory)
    dec = golden_decoder()
    codes = torch.from_numpy(golden["codes"])
    with torch.no_grad():
        wav = dec(codes)[:, 0]
    return check_wav(golden, wav, dec.config.hop, "eager")


def update_golden(directory: Path | None = None) -> str:
    """Regenerate the golden set; report what changed and by how much."""
    directory = directory or default_dir()
    directory.mkdir(parents=True, exist_ok=True)
    dec = golden_decoder()
    codes = golden_codes(dec.config)
    with torch.no_grad():
        wav = dec(codes)[:, 0]
    fields = {"codes": codes.numpy(), **summarize(wav, dec.config.hop)}
    path = directory / GOLDEN_FILE
    report = "new golden set"
    if path.is_file():
        old = load_golden(directory)
        if old["codes"].shape == fields["codes"].shape and (old["codes"] == fields["codes"]).all():
            report = "changed: " + ", ".join(f"{k} max abs {v:.3g}" for k, v in drift(old, wav, dec.config.hop).items())
        else:
            report = "codes changed; all fields regenerated"
    buf = io.BytesIO()
    np.savez_compressed(buf, **fields)
    atomic_write_bytes(path, buf.getvalue())
    return f"wrote {path} ({path.stat().st_size} bytes): {report}"
