"""Manifest v3 (`manifest.json`): what an artifacts directory holds and how it was checked.

Written atomically; loaded against a schema (unknown format_version, missing fields and wrong
types are rejected with the field's path). Paths are relative to the artifacts directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..env import FP16_ARITHMETICS, versions
from ..fileio import atomic_write_bytes, read_json, sha256_file
from ..model.decoder import Code2Wav
from ..program.flows import Flow
from ..program.pipeline import NATIVE, QUALITY, ProgramResult
from ..program.precision import FP32, PRECISIONS, get_precision
from ..program.streaming import StreamCheck, ramp_reason
from ..program.tolerances import tolerance

FORMAT_VERSION = 3  # 3: one method per variant, any chunk min_chunk..max_chunk; 2: one per chunk; 1: no history
MANIFEST = "manifest.json"


class ManifestError(ValueError):
    """manifest.json is missing, not JSON, or does not follow the v3 schema."""


NUM = (int, float)
OPT_NUM = (int, float, type(None))
SPEC = {"name": str, "shape": [int], "dtype": str}
TOL = {"max_abs": NUM, "min_snr_db": NUM, "why": str}
PARITY = {"max_abs": NUM, "snr_db": OPT_NUM, "windows": int, "streams": int}
PROGRAM = {
    "method": str, "variant": str, "min_chunk": int, "max_chunk": int, "context": int, "path": str, "sha256": str,
    "bytes": int,
    "inputs": [SPEC], "outputs": [SPEC], "backend": str, "partitioner": (str, type(None)), "verified": bool,
    "tolerance": TOL, "parity": PARITY,
}
SCHEMA = {
    "format_version": int,
    "model": {"id": str, "config_sha256": str, "weights_sha256": str},
    "versions": {"torch": str, "executorch": (str, type(None)), "c2w_export": str, "python": str},
    "decode": {"variants": [str], "ramp": [int], "ramp_reason": str, "max_chunk": int, "context_frames": int, "hop": int,
               "sample_rate": int, "num_quantizers": int, "codebook_size": int},
    "state": [SPEC],
    "programs": [PROGRAM],
}


def check_schema(value: Any, schema: Any, where: str = "manifest") -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ManifestError(f"{where} must be an object, got {type(value).__name__}")
        for key, sub in schema.items():
            if key not in value:
                raise ManifestError(f"{where} is missing required field '{key}'")
            check_schema(value[key], sub, f"{where}.{key}")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise ManifestError(f"{where} must be a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            check_schema(item, schema[0], f"{where}[{i}]")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            names = "/".join("null" if t is type(None) else t.__name__ for t in types)
            raise ManifestError(f"{where} must be {names}, got {type(value).__name__} {value!r}"[:300])


def build(decoder: Code2Wav, model: str, flow: Flow, variants: Sequence[str], ramp: Sequence[int], max_chunk: int,
          context: int, results: Sequence[ProgramResult], streams: Sequence[StreamCheck], bundles: Mapping[str, dict]) -> dict:
    """The v3 manifest of checked programs: each entry is its `MethodSpec.to_json()` plus file,
    backend, tolerance and parity. Paths are file names (relative to the artifacts directory)."""
    cfg = decoder.config
    files = getattr(decoder, "checkpoint", None)
    hashes: dict[Path, str] = {}
    programs = []
    for r in results:
        if r.path not in hashes:
            hashes[r.path] = sha256_file(r.path)
        d = r.diff
        programs.append({
            **r.spec.to_json(),
            "path": r.path.name, "sha256": hashes[r.path], "bytes": r.path.stat().st_size,
            "backend": flow.name, "partitioner": flow.partitioner,
            "verified": r.passed,  # export writes a manifest only when every program passed
            "tolerance": r.tolerance.to_json(),
            **({"quality": {"tolerance": r.gate(QUALITY).to_json(), "max_abs": r.quality.max_abs,
                            "snr_db": r.quality.to_json()["snr_db"],
                            **({"native_fp16_emulated": {"max_abs": r.stages[NATIVE].max_abs,
                                                         "snr_db": r.stages[NATIVE].to_json()["snr_db"]}}
                               if NATIVE in r.stages else {})}} if r.quality else {}),
            "graph": {"nodes": r.nodes, **({"delegation": r.delegation} if r.delegation else {})},
            "parity": {"max_abs": d.max_abs, "snr_db": d.to_json()["snr_db"], "windows": r.windows, "streams": 1,
                       "stream_max_abs": max(s.diff.max_abs for s in streams if s.name.startswith(r.spec.variant)),
                       "stages": {s: x.max_abs for s, x in r.stages.items()}},
            **({"bundle": bundles[r.spec.method]} if r.spec.method in bundles else {}),
        })
    return {
        "format_version": FORMAT_VERSION,
        "model": {"id": str(model), "config_sha256": cfg.canonical_sha256(),
                  "weights_sha256": sha256_file(files.weights_path) if files else ""},
        "versions": versions(),
        "decode": {"variants": list(variants), "ramp": list(ramp), "ramp_reason": ramp_reason(ramp),
                   "max_chunk": max_chunk, "context_frames": context, "hop": cfg.hop,
                   "sample_rate": cfg.output_sample_rate, "num_quantizers": cfg.num_quantizers,
                   "codebook_size": cfg.codebook_size},
        "precision": precision_record(flow.precision),
        "state": [{"name": n, "shape": list(s), "dtype": str(d).removeprefix("torch.")} for n, s, d in decoder.state_spec()],
        "programs": programs,
    }


def precision_record(name: str) -> dict:
    """The manifest's `precision`: its name, what is reduced, the quality gate it was held to, and
    (reduced) the arithmetic its XNNPACK kernels used on the exporting CPU."""
    p = get_precision(name)
    if name == FP32:
        return p.record()
    arithmetic = p.arithmetic()
    return {**p.record(), "quality_gate": tolerance(QUALITY, p.key).to_json(),
            "arithmetic": {"name": arithmetic, "what": FP16_ARITHMETICS.get(arithmetic, arithmetic)}}


def precision_of(manifest: dict) -> str:
    """The manifest's precision name (fp32 for manifests written before precision was recorded)."""
    return manifest.get("precision", {}).get("name", FP32)


def write(directory: Path, manifest: dict) -> Path:
    """Validate, then write `directory/manifest.json` atomically."""
    check_schema(manifest, SCHEMA)
    path = Path(directory) / MANIFEST
    atomic_write_bytes(path, (json.dumps(manifest, indent=2) + "\n").encode())
    return path


def load(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST} in {directory}: is this an artifacts directory from `c2w-export export`?")
    data = read_json(path, ManifestError)
    if not isinstance(data, dict) or "format_version" not in data:
        raise ManifestError(f"{path}: missing required field 'format_version'")
    if data["format_version"] != FORMAT_VERSION:
        hint = {1: "; v1 windowed programs lack the history input, so re-export with this c2w-export",
                2: "; v2 holds one method per chunk size, this c2w-export one per variant for every size: re-export "
                   "with this c2w-export"}.get(data["format_version"], "") if isinstance(data["format_version"], int) else ""
        raise ManifestError(f"{path}: unknown format_version {data['format_version']!r}; this c2w-export reads "
                            f"{FORMAT_VERSION}{hint}")
    check_schema(data, SCHEMA, str(path))
    if "precision" in data:  # optional: manifests before it are fp32
        check_schema(data["precision"], {"name": str, "key": str}, f"{path}.precision")
        if data["precision"]["name"] not in PRECISIONS:
            raise ManifestError(f"{path}: unknown precision {data['precision']['name']!r}; this c2w-export knows "
                                f"{sorted(PRECISIONS)}")
    for p in data["programs"]:
        for kind, rel in (("program", p["path"]), ("bundle", (p.get("bundle") or {}).get("path"))):
            if rel is not None and (not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts):
                raise ManifestError(f"{path}: {kind} path {rel!r} must be relative to the artifacts directory")
    return data
