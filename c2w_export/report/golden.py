"""Golden numerics: small committed sets (tests/golden/*.npz) from deterministic tiny seed-0
synthetic checkpoints, to track numerics across torch / ExecuTorch upgrades: the plain checkpoint
and the stress one (output clamp, dead codes, small activations, outlier channels).

Each holds the codes, a strided subset of the expected offline audio, per-frame RMS and summary
statistics. Updating is deliberate (`c2w-export golden --update`), never done by tests.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from ..fileio import atomic_write_bytes
from ..model.synth import STRESS
from ..program.compare import compare
from ..program.tolerances import Tolerance, tolerance

FRAMES, CODES_SEED, STRIDE = 40, 20261202, 37
# set name -> (stress options of the tiny seed-0 checkpoint, tolerance key)
GOLDEN_SETS: dict[str, tuple[tuple[str, ...], str]] = {
    "tiny_seed0": ((), "golden"),
    "tiny_stress_seed0": (STRESS, "stress"),
}


def default_dir() -> Path:
    return Path.cwd() / "tests" / "golden"


def golden_tolerance(name: str) -> Tolerance:
    return tolerance(GOLDEN_SETS[name][1])


def golden_decoder(name: str = "tiny_seed0"):
    from ..model.config import preset
    from ..model.synth import make_decoder

    if name not in GOLDEN_SETS:
        raise ValueError(f"unknown golden set {name!r}; choose from {sorted(GOLDEN_SETS)}")
    return make_decoder(preset("tiny"), 0, GOLDEN_SETS[name][0])


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


def load_golden(directory: Path | None = None, name: str = "tiny_seed0") -> dict[str, np.ndarray]:
    path = (directory or default_dir()) / f"{name}.npz"
    if not path.is_file():
        raise FileNotFoundError(f"golden set {path} not found; create it with `c2w-export golden --update`")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def drift(golden: dict[str, np.ndarray], wav: torch.Tensor, hop: int) -> dict[str, float]:
    """Max abs change per stored field of `wav` against the golden set."""
    now = summarize(wav, hop)
    return {k: float(np.abs(now[k].astype(np.float64) - golden[k].astype(np.float64)).max()) for k in now}


def check_wav(golden: dict[str, np.ndarray], wav: torch.Tensor, hop: int, flow: str,
              tol: Tolerance | None = None) -> tuple[bool, str]:
    tol = tol or tolerance("golden")
    d = compare(torch.from_numpy(summarize(wav, hop)["samples"]), torch.from_numpy(golden["samples"]))
    per_field = drift(golden, wav, hop)
    ok = d.within(tol) and all(v <= tol.max_abs for v in per_field.values())
    text = (f"{flow}: drift vs golden {d.describe()}; per field "
            + ", ".join(f"{k} {v:.3g}" for k, v in per_field.items())
            + f" (tolerance {tol.max_abs:g})")
    return ok, text


def check_golden(directory: Path | None = None) -> tuple[bool, str]:
    """Eager offline decode against every committed golden set."""
    oks, texts = [], []
    for name in GOLDEN_SETS:
        golden = load_golden(directory, name)
        dec = golden_decoder(name)
        with torch.no_grad():
            wav = dec(torch.from_numpy(golden["codes"]))[:, 0]
        ok, text = check_wav(golden, wav, dec.config.hop, f"eager ({name})", golden_tolerance(name))
        oks.append(ok)
        texts.append(text)
    return all(oks), "\n".join(texts)


def update_golden(directory: Path | None = None) -> str:
    """Regenerate every golden set; report what changed and by how much."""
    directory = directory or default_dir()
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for name in GOLDEN_SETS:
        dec = golden_decoder(name)
        codes = golden_codes(dec.config)
        with torch.no_grad():
            wav = dec(codes)[:, 0]
        fields = {"codes": codes.numpy(), **summarize(wav, dec.config.hop)}
        path = directory / f"{name}.npz"
        report = "new golden set"
        if path.is_file():
            old = load_golden(directory, name)
            if old["codes"].shape == fields["codes"].shape and (old["codes"] == fields["codes"]).all():
                report = "changed: " + ", ".join(f"{k} max abs {v:.3g}" for k, v in drift(old, wav, dec.config.hop).items())
            else:
                report = "codes changed; all fields regenerated"
        buf = io.BytesIO()
        np.savez_compressed(buf, **fields)
        atomic_write_bytes(path, buf.getvalue())
        lines.append(f"wrote {path} ({path.stat().st_size} bytes): {report}")
    return "\n".join(lines)
