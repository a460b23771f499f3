"""The I/O contract a manifest publishes to an app (methods, chunk range, input and output names,
shapes and dtypes, the state spec and its order, hop and sample rate), checked against what does
not come from the manifest: the programs' own metadata (decode and verify, `program_problems`) and
the checkpoint the artifacts were built from (verify, `checkpoint_problems`). Each problem is one
line naming the manifest field (a JSON path) and both values."""

from __future__ import annotations

from typing import Mapping

from ..model.decoder import Code2Wav
from ..program.flows import Loaded
from ..program.streaming import check_ramp
from ..program.variants import HISTORY, VARIANTS, MethodSpec, make_variant, method_name


def _tensor(name: str, shape, dtype: str, chunk_axis: int | None = None, per_chunk: int = 0) -> dict:
    return {"name": name, "shape": list(shape), "dtype": dtype,
            **({"chunk_axis": chunk_axis, "per_chunk": per_chunk} if chunk_axis is not None else {})}


def published_spec(manifest: dict, variant: str) -> dict:
    """The MethodSpec JSON of `variant` that the manifest's `decode` and `state` imply (what an app
    reading them expects a method to take and return)."""
    d = manifest["decode"]
    context = d["context_frames"] if variant == "windowed" else 0
    codes = _tensor("codes", (1, d["num_quantizers"], context + d["max_chunk"]), "int64", 2, 1)
    wav = _tensor("wav", (1, d["max_chunk"] * d["hop"]), "float32", 1, d["hop"])
    state = [_tensor(s["name"], s["shape"], s["dtype"]) for s in manifest["state"]]
    inputs = [codes, _tensor(HISTORY, (1,), "int64")] if variant == "windowed" else [codes, *state]
    outputs = [wav] if variant == "windowed" else [wav, *state]
    return {"method": method_name(variant), "variant": variant, "min_chunk": 1, "max_chunk": d["max_chunk"],
            "context": context, "inputs": inputs, "outputs": outputs}


def _diff(got, want, path: str) -> str | None:
    """The first JSON path where `got` differs from `want`, with both values; None when equal."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in want:
            if k not in got:
                return f"{path}.{k} is absent (expected {want[k]!r})"
            found = _diff(got[k], want[k], f"{path}.{k}")
            if found:
                return found
        extra = sorted(set(got) - set(want))
        return f"{path}.{extra[0]} is not part of the contract" if extra else None
    if isinstance(want, list) and isinstance(got, list):
        for i, (g, w) in enumerate(zip(got, want)):
            found = _diff(g, w, f"{path}[{i}]")
            if found:
                return found
        if len(got) != len(want):
            return f"{path} has {len(got)} entries, expected {len(want)}"
        return None
    return None if got == want and type(got) is type(want) else f"{path} is {got!r}, expected {want!r}"


SPEC_KEYS = ("method", "variant", "min_chunk", "max_chunk", "context", "inputs", "outputs")


def manifest_problems(manifest: dict) -> list[str]:
    """What the manifest contradicts in itself: its variants against its programs, each program's
    published spec against what `decode` and `state` imply, and the ramp against the chunk range."""
    d, progs = manifest["decode"], manifest["programs"]
    problems = []
    variants = [p["variant"] for p in progs]
    if sorted(set(variants)) != sorted(d["variants"]) or len(set(variants)) != len(variants):
        problems.append(f"$.decode.variants is {d['variants']}, the programs are {variants} (one program per variant)")
    try:
        check_ramp(d["ramp"], d["max_chunk"])
    except ValueError as e:
        problems.append(f"$.decode.ramp: {e}")
    for i, p in enumerate(progs):
        if p["variant"] in VARIANTS:
            found = _diff({k: p[k] for k in SPEC_KEYS}, published_spec(manifest, p["variant"]), f"$.programs[{i}]")
            if found:
                problems.append(found + " (from $.decode and $.state)")
    return problems


def program_problems(manifest: dict, specs: Mapping[str, MethodSpec], loaded: Mapping[str, Loaded]) -> list[str]:
    """Each method's published inputs and outputs against the program's own metadata (count, dtype,
    shape at the largest chunk; Loaded.io_meta), for the methods whose program carries it."""
    problems = []
    index = {p["method"]: i for i, p in enumerate(manifest["programs"])}
    for method, spec in specs.items():
        meta = loaded[method].io_meta(method)
        if meta is None:
            continue
        for side, published, held in (("inputs", spec.inputs, meta[0]), ("outputs", spec.outputs, meta[1])):
            path = f"$.programs[{index[method]}].{side}"
            if len(published) != len(held):
                problems.append(f"{path} lists {len(published)}, the program's {method} has {len(held)}")
                continue
            for j, (s, (shape, dtype)) in enumerate(zip(published, held)):
                same_shape = len(shape) == len(s.shape) and all(h is None or h == w for h, w in zip(shape, s.shape))
                if s.dtype != dtype or not same_shape:
                    problems.append(f"{path}[{j}] ('{s.name}') is {s.dtype} {list(s.shape)}, the program's {method} "
                                    f"takes {dtype} {[h if h is not None else 'dynamic' for h in shape]}")
    return problems


def checkpoint_problems(manifest: dict, decoder: Code2Wav) -> list[str]:
    """The published contract against the one the checkpoint's decoder defines: the state spec,
    every program's spec (rebuilt by make_variant) and the decode fields an app reads."""
    cfg, d = decoder.config, manifest["decode"]
    problems = []
    want = {"hop": cfg.hop, "sample_rate": cfg.output_sample_rate, "num_quantizers": cfg.num_quantizers,
            "codebook_size": cfg.codebook_size}
    found = _diff({k: d[k] for k in want}, want, "$.decode")
    problems += [f"{found} (the checkpoint's)"] if found else []
    state = [_tensor(n, s, str(t).removeprefix("torch.")) for n, s, t in decoder.state_spec()]
    found = _diff(manifest["state"], state, "$.state")
    problems += [f"{found} (the checkpoint's decoder state)"] if found else []
    for i, p in enumerate(manifest["programs"]):
        if p["variant"] in VARIANTS:
            rebuilt = make_variant(decoder, p["variant"], p["max_chunk"], p["context"]).spec().to_json()
            found = _diff({k: p[k] for k in SPEC_KEYS}, rebuilt, f"$.programs[{i}]")
            problems += [f"{found} (the checkpoint's {p['variant']} method)"] if found else []
    return problems
