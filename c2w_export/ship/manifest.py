"""Manifest v3 (`manifest.json`): what an artifacts directory holds and how it was checked.

Written atomically; validated against its JSON Schema (manifest.schema.json, published as
docs/manifest.schema.json) when written and loaded: an unknown format_version, a missing field, a
wrong type or an out-of-range value is rejected with the field's JSON path. Paths are relative to
the artifacts directory.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..env import describe_arithmetic, versions
from ..fileio import atomic_write_bytes, read_json, sha256_file
from ..model.decoder import Code2Wav
from ..program.flows import Flow
from ..program.pipeline import NATIVE, QUALITY, ProgramResult
from ..program.precision import FP32, PRECISIONS, get_precision
from ..program.streaming import StreamCheck, ramp_reason
from ..program.tolerances import tolerance

FORMAT_VERSION = 3  # 3: one method per variant, any chunk min_chunk..max_chunk; 2: one per chunk; 1: no history
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 8 << 20  # a real-size manifest is ~50 KB; a larger one is refused before it is read


class ManifestError(ValueError):
    """manifest.json is missing, not JSON, or does not follow the v3 schema."""


SCHEMA_FILE = Path(__file__).with_name("manifest.schema.json")  # published in docs/ too


@lru_cache(maxsize=1)
def schema() -> dict:
    """The manifest's JSON Schema (draft 2020-12), shipped in the package."""
    return json.loads(SCHEMA_FILE.read_text())


def check_schema(data: Any, where: str = "manifest") -> None:
    """Validate `data` against schema(); ManifestError naming the JSON path of the most relevant
    error (and how many more there are)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    errors = list(Draft202012Validator(schema()).iter_errors(data))
    if errors:
        e = best_match(errors)
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        message = e.message if len(e.message) <= 200 else e.message[:200] + "..."
        raise ManifestError(f"{where}: {e.json_path}: {message}{more}")


def missing_records(data: dict) -> list[str]:
    """JSON paths of the record-only fields ("x-record" in the schema: how it was built and
    checked, read by no one) that `data` lacks; verify warns about each."""
    out = []

    def walk(value, sub: dict, path: str) -> None:
        sub = schema()["$defs"][sub["$ref"].rsplit("/", 1)[1]] if "$ref" in sub else sub
        if isinstance(value, dict):
            for key, prop in sub.get("properties", {}).items():
                if key in value:
                    walk(value[key], prop, f"{path}.{key}")
                elif prop.get("x-record"):
                    out.append(f"{path}.{key}")
        elif isinstance(value, list) and "items" in sub:
            for i, item in enumerate(value):
                walk(item, sub["items"], f"{path}[{i}]")
    walk(data, schema(), "$")
    return out


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
            **({"memory": {"plan_bytes": r.plan_bytes}} if r.plan_bytes else {}),
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
            "arithmetic": {"name": arithmetic, "what": describe_arithmetic(arithmetic)}}


def precision_of(manifest: dict) -> str:
    """The manifest's precision name (fp32 for manifests written before precision was recorded)."""
    return manifest.get("precision", {}).get("name", FP32)


def write(directory: Path, manifest: dict) -> Path:
    """Validate, then write `directory/manifest.json` atomically."""
    check_schema(manifest)
    path = Path(directory) / MANIFEST
    atomic_write_bytes(path, (json.dumps(manifest, indent=2) + "\n").encode())
    return path


def load(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST} in {directory}: is this an artifacts directory from `c2w-export export`?")
    data = read_json(path, ManifestError, MAX_MANIFEST_BYTES)
    if not isinstance(data, dict) or "format_version" not in data:
        raise ManifestError(f"{path}: missing required field 'format_version'")
    if data["format_version"] != FORMAT_VERSION:
        hint = {1: "; v1 windowed programs lack the history input, so re-export with this c2w-export",
                2: "; v2 holds one method per chunk size, this c2w-export one per variant for every size: re-export "
                   "with this c2w-export"}.get(data["format_version"], "") if isinstance(data["format_version"], int) else ""
        raise ManifestError(f"{path}: unknown format_version {data['format_version']!r}; this c2w-export reads "
                            f"{FORMAT_VERSION}{hint}")
    check_schema(data, str(path))
    if "precision" in data:  # optional: manifests before it are fp32
        if data["precision"]["name"] not in PRECISIONS:
            raise ManifestError(f"{path}: unknown precision {data['precision']['name']!r}; this c2w-export knows "
                                f"{sorted(PRECISIONS)}")
    for p in data["programs"]:
        for kind, rel in (("program", p["path"]), ("bundle", (p.get("bundle") or {}).get("path"))):
            if rel is not None and (not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts):
                raise ManifestError(f"{path}: {kind} path {rel!r} must be relative to the artifacts directory")
    return data
