"""Every reader fuzzed (issue 32): Hypothesis draws damaged inputs for each surface a team's files
reach, and runs them through the CLI's `decode` and `verify` (or the library call that reads them)
in this process, on the XNNPACK artifacts (one multi-method .pte, both variants, bundled vectors).

Properties, on every case:
- exit 0, 1 or 2, never a traceback (a crash of the process fails the worker);
- exit 2 is one line that names the file it read;
- nothing partial: a refused decode writes no WAV;
- verify fails whatever decode refuses (`agree`).

Cases per surface: the Hypothesis profile's count (ci: 20; `tox -e fuzz`: the fuzz profile, 50x,
which also writes reports/fuzz.md through tests/fuzz_report.py). Every counterexample found is kept
in REGRESSIONS, run as an explicit case on every run.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import os
import shutil
import struct
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from helpers import CleanRunner, cases, cli_in_process, manifest_edit, rehash, seeds

OUTCOMES: Counter = Counter()  # (surface, outcome) -> cases, for reports/fuzz.md (C2W_FUZZ_RAW)
FRAMES = 5  # frames of the codes decode runs on: 3 chunks of the ramp [2]


# ---------------------------------------------------------------- JSON mutations (manifest, config, header)
ODD = [None, -1, 0, 1, 2 ** 63, -(2 ** 63), 2 ** 31, 1.5, 1e308, math.nan, "", "x" * 5000, "../../etc/passwd",
       [], {}, True, False, "float16", [1, 2, 3], {"a": 1}]
OPS = ("delete", "set", "nudge", "duplicate", "swap")


def json_paths(node, prefix=()) -> list[tuple]:
    """Every path (keys and indices) to a value below the root."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out += json_paths(v, prefix + (k,))
    return out


def _nudged(v):
    """A plausible edit of a value: the kind a broken tool or a hand edit makes."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v * 2 + 1
    if isinstance(v, str):
        return v + "_x"
    if isinstance(v, list):
        return v[:-1] if v else [0]
    return {**v, "extra": 1}


@st.composite
def json_mutation(draw, doc: dict, paths: list[tuple]):
    """(mutated copy of doc, readable description) by one op at one drawn path."""
    path = draw(st.sampled_from(paths))
    op = draw(st.sampled_from(OPS))
    doc = copy.deepcopy(doc)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key, value = path[-1], parent[path[-1]]
    if op == "delete":
        del parent[key]
    elif op == "set":
        parent[key] = copy.deepcopy(draw(st.sampled_from(ODD)))
    elif op == "nudge":
        parent[key] = _nudged(value)
    elif op == "swap" and isinstance(parent, list) and len(parent) > 1:
        j = (key + 1) % len(parent)
        parent[key], parent[j] = parent[j], parent[key]
    elif isinstance(parent, list):  # duplicate (or swap in a list of one)
        parent.insert(key, copy.deepcopy(value))
        op = "duplicate"
    else:  # duplicate or swap in an object: the value of a sibling key
        other = draw(st.sampled_from(sorted(parent, key=str)))
        parent[key] = copy.deepcopy(parent[other])
        op = f"{op} from {other!r}"
    shown = repr(parent.get(key) if isinstance(parent, dict) else parent[key] if key < len(parent) else None)[:60]
    return doc, f"{op} $" + "".join(f"[{k!r}]" for k in path) + ("" if op == "delete" else f" -> {shown}")


# ---------------------------------------------------------------- runs and properties
class Case:
    """One fuzz case in a fresh directory: a copy of the artifacts (and, when asked, the model)."""

    def __init__(self, run, artifacts: Path, model: Path | None = None):
        self.run = run  # the CLI: a CleanRunner
        self.tmp = Path(tempfile.mkdtemp(prefix="c2w-fuzz-"))
        self.root = self.tmp / "art"
        shutil.copytree(artifacts, self.root)
        self.model = None
        if model is not None:
            self.model = self.tmp / "model"
            shutil.copytree(model, self.model)
        self.codes = self.tmp / "codes.npy"
        np.save(self.codes, np.zeros((16, FRAMES), np.int64))
        self.wav = self.tmp / "out.wav"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def decode(self, codes: Path | None = None, *extra: str):
        return self.run(["decode", "--artifacts", str(self.root), "--codes", str(codes or self.codes),
                               "--out", str(self.wav), *extra])

    def verify(self, *extra: str):
        model = ["--model", str(self.model)] if self.model else []
        return self.run(["verify", "--artifacts", str(self.root), "--windows", "1", *model, *extra])

    def rehash(self, rel: str) -> None:
        rehash(self.root, rel)


def clean(result, names: tuple[str, ...], what: str) -> int:
    """A CLI result obeys the properties: exit 0/1/2, no traceback, exit 2 is one line naming one of
    `names`, exit 1 shows a FAIL row. Returns the exit code."""
    rc, out, err = result  # rc < 0: the process was killed (CleanRunner)
    assert "Traceback" not in err and rc in (0, 1, 2), f"{what}: exit {rc}\n{err[-3000:]}"
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("c2w-export: error: "), f"{what}: not one line:\n{err[-3000:]}"
        assert any(n in lines[0] for n in names), f"{what}: the line names none of {names}: {lines[0]}"
    if rc == 1:
        assert "FAIL" in out, f"{what}: exit 1 without a FAIL row\n{out[-3000:]}"
    return rc


def record(surface: str, outcome: str) -> None:
    OUTCOMES[(surface, outcome)] += 1


def agree(surface: str, what: str, case: Case, names: tuple[str, ...], decode=True) -> None:
    """decode (when it reads this surface) and verify on the case; both clean; verify fails what
    decode refuses; a refused decode wrote no WAV."""
    d = clean(case.decode(), names, f"decode ({what})") if decode else None
    if d == 2:
        assert not case.wav.exists(), f"decode refused ({what}) but left {case.wav}"
    v = clean(case.verify(), names, f"verify ({what})")
    if d == 2:
        assert v in (1, 2), f"decode refused ({what}) but verify passed"
    record(surface, (f"decode {d}, " if decode else "") + f"verify {v}")


@pytest.fixture(scope="module")
def clean_cli():
    """The CLI in forks of a process that never runs ExecuTorch itself (helpers.CleanRunner)."""
    run = CleanRunner()
    yield run
    run.close()


@pytest.fixture(scope="session", autouse=True)
def _write_outcomes():
    """Under `tox -e fuzz` (C2W_FUZZ_RAW): this worker's cases per surface and outcome, as JSON,
    for tests/fuzz_report.py."""
    yield
    raw = os.environ.get("C2W_FUZZ_RAW")
    if raw and OUTCOMES:
        Path(raw).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        rows = [{"surface": s, "outcome": o, "cases": n} for (s, o), n in sorted(OUTCOMES.items())]
        (Path(raw) / f"{worker}.json").write_text(json.dumps(rows, indent=1))


# ---------------------------------------------------------------- surfaces
MANIFEST_NAMES = ("manifest.json",)
PTE, BPTE = "code2wav.pte", "code2wav.bpte"


def _manifest(et_artifacts) -> dict:
    return json.loads((et_artifacts / "manifest.json").read_text())


@pytest.fixture(scope="module")
def manifest_mutations(et_artifacts):
    m = _manifest(et_artifacts)
    return json_mutation(m, json_paths(m))


def test_manifest(clean_cli, et_artifacts, manifest_mutations):
    @given(manifest_mutations)
    def run(mutation):
        doc, what = mutation
        with Case(clean_cli, et_artifacts) as case:
            (case.root / "manifest.json").write_text(json.dumps(doc))
            agree("manifest.json", what, case, MANIFEST_NAMES)
    run()


def test_program_bytes(clean_cli, et_artifacts):
    """The .pte truncated or with bits flipped; most cases behind a re-hashed (loosened) manifest,
    so the runtime reads the damaged bytes."""
    size = (et_artifacts / PTE).stat().st_size

    @given(st.data())
    def run(data):
        with Case(clean_cli, et_artifacts) as case:
            what = _damage(data, case.root / PTE, size)
            if data.draw(st.booleans().map(lambda b: b or data.draw(st.integers(0, 4)) > 0), label="rehash"):
                case.rehash(PTE)
                what += ", manifest re-hashed"
            agree(PTE, what, case, (PTE, "manifest.json"))  # a re-hashed size of 0 is the manifest's error
    run()


def test_bundle_bytes(clean_cli, et_artifacts):
    """The .bpte truncated or flipped (verify runs its vectors; decode never reads it)."""
    size = (et_artifacts / BPTE).stat().st_size

    @given(st.data())
    def run(data):
        with Case(clean_cli, et_artifacts) as case:
            what = _damage(data, case.root / BPTE, size)
            if data.draw(st.integers(0, 4), label="rehash") > 0:
                case.rehash(BPTE)
                what += ", manifest re-hashed"
            agree(BPTE, what, case, (BPTE, "manifest.json"), decode=False)
    run()


def _damage(data, path: Path, size: int) -> str:
    """Truncate `path` or flip 1-16 of its bits at drawn offsets -> a description."""
    raw = bytearray(path.read_bytes())
    if data.draw(st.integers(0, 3), label="truncate?") == 0:
        cut = data.draw(st.integers(0, size - 1), label="cut")
        path.write_bytes(raw[:cut])
        return f"truncated to {cut} of {size} bytes"
    flips = data.draw(st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 7)), min_size=1, max_size=16),
                      label="flips")
    for at, bit in flips:
        raw[at] ^= 1 << bit
    path.write_bytes(raw)
    return f"bits flipped at {sorted(at for at, _ in flips)[:6]}{'...' if len(flips) > 6 else ''}"


# ---------------------------------------------------------------- codes files
DTYPES = ["<i8", ">i8", "<i4", "<u2", "<u8", "<f4", "<f8", "|b1", "|u1", "<c8"]


@st.composite
def code_arrays(draw):
    """An array a codes file might hold: drawn dtype, byte order, shape and values, C or Fortran order."""
    shape = draw(st.sampled_from([(16, FRAMES), (1, 16, FRAMES), (16, 1), (16, 40), (16, 0), (0,), (), (15, 5),
                                  (17, 5), (2, 16, 5), (1, 1, 16, 5), (5, 16)]))
    dtype = draw(st.sampled_from(DTYPES))
    low, high = draw(st.sampled_from([(0, 1), (0, 2047), (-3, 3), (2040, 4100), (-(2 ** 62), 2 ** 62)]))
    values = np.random.default_rng(draw(st.integers(0, 2 ** 16))).integers(low, high, size=shape, endpoint=True)
    with np.errstate(all="ignore"):
        arr = values.astype(np.dtype(dtype))
    return (np.asfortranarray(arr) if draw(st.booleans()) else arr), f"{dtype} {list(shape)} in [{low}, {high}]"


def _npy(data) -> tuple[bytes, str]:
    arr, what = data.draw(code_arrays(), label="array")
    buf = io.BytesIO()
    np.save(buf, arr)
    raw = bytearray(buf.getvalue())
    damage = data.draw(st.sampled_from(["none", "none", "truncate", "flip", "claim"]), label="damage")
    if damage == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1), label="cut")]
    elif damage == "flip":
        for at in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8), label="flips"):
            raw[at] ^= 0xFF
    elif damage == "claim":  # the header claims another shape; the data stays
        n = int.from_bytes(raw[8:10], "little")
        claim = data.draw(st.sampled_from(["(16, 10000000)", "(1000000000000,)", "(16, 6)", "(16, 4)", "(-1, 5)"]))
        header = raw[10:10 + n].decode("latin1")
        start = header.index("'shape': ") + 9
        header = header[:start] + claim + header[header.index(")", start) + 1:]
        header = header.rstrip("\n ")[:n - 1].ljust(n - 1) + "\n"
        raw = raw[:10] + header.encode("latin1") + raw[10 + n:]
        what += f", header claims {claim}"
    return bytes(raw), f"{what}, {damage}"


def _pt(data) -> tuple[bytes, str]:
    kind = data.draw(st.sampled_from(["tensor", "tensor", "view", "dict", "list", "int", "class", "damaged"]), label="kind")
    arr, what = data.draw(code_arrays(), label="array")
    t = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="))) if arr.dtype != np.dtype("<c8") else torch.zeros(3)
    obj = {"tensor": t, "view": torch.zeros(FRAMES, 16, dtype=torch.int64).t(), "dict": {"codes": t}, "list": [t],
           "int": 7, "class": __import__("argparse").Namespace(codes=t), "damaged": t}[kind]
    buf = io.BytesIO()
    torch.save(obj, buf)
    raw = bytearray(buf.getvalue())
    if kind == "damaged":
        for at in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8), label="flips"):
            raw[at] ^= 0xFF
    return bytes(raw), f"{kind}: {what}"


@pytest.mark.parametrize("suffix,make", [pytest.param(".npy", _npy, id="npy"), pytest.param(".pt", _pt, id="pt")])
def test_codes_files(clean_cli, et_artifacts, suffix, make):
    surface = f"codes {suffix}"

    @given(st.data())
    def run(data):
        raw, what = make(data)
        with Case(clean_cli, et_artifacts) as case:
            path = case.tmp / f"codes{suffix}"
            path.write_bytes(raw)
            rc = clean(case.decode(path), (path.name,), f"decode ({what})")
            if rc == 0:  # decoded: a whole WAV of the codes' frames
                frames = (case.wav.stat().st_size - 44) // 2 // 1920
                assert frames >= 1, what
            else:
                assert not case.wav.exists(), f"decode refused ({what}) but left a WAV"
            record(surface, f"decode {rc}")
    run()


# ---------------------------------------------------------------- tensors handed to the library
@pytest.fixture(scope="module")
def opened(et_artifacts):
    """The artifacts opened and loaded once: (Artifacts, Dispatch)."""
    from c2w_export.ship.artifacts import open_artifacts

    art = open_artifacts(et_artifacts)
    programs = art.programs()
    programs.preload(warm=False)
    return art, programs


def _odd_tensor(data, like: torch.Tensor):
    """A drawn stand-in for `like`: another dtype, shape, layout, non-finite values or not a tensor."""
    kind = data.draw(st.sampled_from(["same", "dtype", "shape", "nan", "inf", "huge", "strided", "not-a-tensor",
                                      "int-list", "numpy"]), label="odd")
    x = like.clone()
    if kind == "dtype":
        x = x.to(data.draw(st.sampled_from([torch.float16, torch.float64, torch.int64, torch.bfloat16, torch.bool])))
    elif kind == "shape":
        shape = list(like.shape)
        i = data.draw(st.integers(0, max(len(shape) - 1, 0)))
        shape = data.draw(st.sampled_from([shape[:i] + shape[i + 1:], shape + [1], [*shape[:i], shape[i] + 1, *shape[i + 1:]],
                                           [*shape[:i], 0, *shape[i + 1:]]]))
        x = torch.zeros(shape, dtype=like.dtype)
    elif kind in ("nan", "inf", "huge") and like.is_floating_point() and like.numel():
        flat = x.view(-1)
        flat[data.draw(st.integers(0, flat.numel() - 1))] = {"nan": math.nan, "inf": -math.inf, "huge": 3e38}[kind]
    elif kind == "strided":
        x = torch.zeros(*like.shape[:-1], like.shape[-1] * 2, dtype=like.dtype)[..., ::2] if like.ndim else x
    elif kind == "not-a-tensor":
        x = data.draw(st.sampled_from([None, 0, "codes"]))
    elif kind == "int-list":
        x = like.tolist()
    elif kind == "numpy":
        x = like.numpy()
    return x, kind


def _refused_cleanly(call, what):
    """call() returns, or raises InputError (bad input) or FlowError (a non-finite output: a state
    of huge values), each in one line: what the CLI prints with exit 2."""
    from c2w_export.model.validate import InputError
    from c2w_export.program.flows import FlowError

    try:
        call()
        return "ran"
    except (InputError, FlowError) as e:
        assert "\n" not in str(e) and str(e), f"{what}: {e!r}"
        return type(e).__name__


def test_state_tensors(opened):
    """The stateful method's inputs as an app hands them to a Runner: one state tensor (or the
    codes) replaced by an odd stand-in, an entry dropped or one added."""
    art, programs = opened
    spec = art.specs["stateful"]
    good = [torch.zeros(1, spec.inputs[0].shape[1], 2, dtype=torch.int64), *art.initial_state()]

    @given(st.data())
    def run(data):
        inputs = list(good)
        change = data.draw(st.sampled_from(["replace", "replace", "replace", "drop", "add"]), label="change")
        i = data.draw(st.integers(0, len(inputs) - 1), label="entry")
        if change == "replace":
            inputs[i], kind = _odd_tensor(data, inputs[i])
        elif change == "drop":
            inputs.pop(i)
            kind = "dropped"
        else:
            inputs.insert(i, inputs[i].clone())
            kind = "added"
        what = f"{change} {spec.inputs[min(i, len(spec.inputs) - 1)].name}: {kind}"
        outcome = _refused_cleanly(lambda: programs.run("stateful", inputs), what)
        record("state tensors", outcome)
    run()


def test_pushed_codes(opened):
    """Codes pushed into an open StreamDecoder: a refused push leaves the stream as it was, so the
    stream decodes the good codes pushed after it to the same audio as a stream that never saw it."""
    from c2w_export.ship.decode import open_stream

    art, _ = opened
    good = torch.randint(0, art.decode["codebook_size"], (1, art.decode["num_quantizers"], 4),
                         generator=torch.Generator().manual_seed(0))
    fresh, _ = open_stream(art)
    expected = torch.cat([*fresh.push(good), *fresh.finish()], dim=-1)

    size = art.decode["codebook_size"]

    @given(st.data())
    def run(data):
        stream, _ = open_stream(art)
        frames, seed = data.draw(st.integers(1, 6), label="frames"), data.draw(seeds, label="seed")
        like = torch.randint(0, size, (1, good.shape[1], frames), generator=torch.Generator().manual_seed(seed))
        bad, kind = _odd_tensor(data, like)
        if kind == "same":
            kind = data.draw(st.sampled_from(["empty", "out-of-range", "valid"]), label="codes")
            if kind == "empty":
                bad = bad[:, :, :0]
            elif kind == "out-of-range":
                bad.view(-1)[data.draw(st.integers(0, bad.numel() - 1))] = data.draw(st.sampled_from([-1, size, 2**40]))
        outcome = _refused_cleanly(lambda: stream.push(bad), f"push ({kind})")
        if outcome == "ran" and kind != "empty":
            return record("pushed codes", outcome)  # accepted: part of the stream now, nothing to compare
        got = torch.cat([*stream.push(good), *stream.finish()], dim=-1)
        assert torch.equal(got, expected), f"a refused push ({kind}) changed the stream"
        record("pushed codes", outcome)
    run()


# ---------------------------------------------------------------- the checkpoint
CHECKPOINT_NAMES = ("config.json", "model.safetensors", "speech_tokenizer")


@pytest.fixture(scope="module")
def config_mutations(model_dir):
    from c2w_export.model.checkpoint import resolve

    doc = json.loads(resolve(model_dir).config_path.read_text())
    return json_mutation(doc, json_paths(doc))


def test_checkpoint_config(clean_cli, et_artifacts, model_dir, config_mutations):
    """config.json mutated; verify --model reads it (decode never does)."""
    @given(config_mutations)
    def run(mutation):
        doc, what = mutation
        with Case(clean_cli, et_artifacts, Path(model_dir)) as case:
            (case.model / "speech_tokenizer" / "config.json").write_text(json.dumps(doc))
            agree("config.json", what, case, CHECKPOINT_NAMES, decode=False)
    run()


def _header(path: Path) -> tuple[int, dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return n, json.loads(raw[8:8 + n]), raw[8 + n:]


@pytest.fixture(scope="module")
def header_mutations(model_dir):
    from c2w_export.model.checkpoint import resolve

    _, header, _ = _header(resolve(model_dir).weights_path)
    return json_mutation(header, json_paths(header))


def test_checkpoint_safetensors(clean_cli, et_artifacts, model_dir, header_mutations):
    """model.safetensors: its JSON header mutated, its length prefix changed, or the file cut."""
    @given(st.data())
    def run(data):
        with Case(clean_cli, et_artifacts, Path(model_dir)) as case:
            path = case.model / "speech_tokenizer" / "model.safetensors"
            n, header, body = _header(path)
            kind = data.draw(st.sampled_from(["header", "header", "header", "length", "truncate"]), label="kind")
            if kind == "header":
                doc, what = data.draw(header_mutations, label="mutation")
                text = json.dumps(doc).encode()
                path.write_bytes(struct.pack("<Q", len(text)) + text + body)
            elif kind == "length":
                claim = data.draw(st.sampled_from([0, 1, n - 1, n + 1, 2 ** 40, 2 ** 64 - 1]), label="length")
                path.write_bytes(struct.pack("<Q", claim) + path.read_bytes()[8:])
                what = f"length prefix {claim} (header is {n} bytes)"
            else:
                cut = data.draw(st.integers(0, path.stat().st_size - 1), label="cut")
                path.write_bytes(path.read_bytes()[:cut])
                what = f"truncated to {cut} bytes"
            agree("model.safetensors", what, case, CHECKPOINT_NAMES, decode=False)
    run()


# ---------------------------------------------------------------- options
def test_options(clean_cli, et_artifacts):
    """decode's --ramp and --variant, verify's --windows: drawn, valid or not."""
    size = st.sampled_from([-(2 ** 70), -1, 0, 1, 2, 3, 4, 25, 26, 10 ** 9])

    @given(st.lists(size, min_size=1, max_size=6), st.sampled_from(["stateful", "windowed", "both", ""]),
           st.sampled_from([-1, 0, 1, 2, 10 ** 9, "x"]))
    def run(ramp, variant, windows):
        with Case(clean_cli, et_artifacts) as case:
            d = clean(case.decode(None, "--ramp", *map(str, ramp), "--variant", variant), ("--ramp", "--variant", "ramp",
                      "variant", "chunk"), f"decode --ramp {ramp} --variant {variant!r}")
            if d == 2:
                assert not case.wav.exists()
            v = clean(case.verify("--windows", str(windows)), ("--windows", "windows"), f"verify --windows {windows}")
            record("options", f"decode {d}, verify {v}")
    run()


# ---------------------------------------------------------------- counterexamples, kept
FUZZED_PTE = "50241c38"  # sha256 prefix of the .pte the fuzz found the offsets below in


def _flip(rel: str, at: int, bit: int, rehash: bool = True, layout_bound: bool = False):
    """Flip one bit of an artifact. `layout_bound`: the offset reaches its failure only in the .pte
    the fuzz found it in (FUZZED_PTE); in a program of another layout the case checks the
    properties alone (one clean line or a FAIL row, no partial output)."""
    def damage(case: Case):
        raw = bytearray((case.root / rel).read_bytes())
        raw[at] ^= 1 << bit
        (case.root / rel).write_bytes(raw)
        if rehash:
            case.rehash(rel)
    damage.layout_bound = layout_bound
    return damage


def _truncate(rel: str, size: int):
    def damage(case: Case):
        (case.root / rel).write_bytes((case.root / rel).read_bytes()[:size])
        case.rehash(rel)
    return damage


def _codes_pt(obj):
    def damage(case: Case):
        torch.save(obj, case.tmp / "codes.pt")
        case.codes = case.tmp / "codes.pt"
    return damage


def _config(**changes):
    def damage(case: Case):
        path = case.model / "speech_tokenizer" / "config.json"
        doc = json.loads(path.read_text())
        doc["decoder_config"].update(changes)
        path.write_text(json.dumps(doc))
    return damage


# Every counterexample the fuzz found (tiny seed 0, XNNPACK, both variants, .pte sha256 50241c38...):
# (id, damage, run "decode" and/or "verify" with --model, what the one line or the FAIL row says).
# The bit offsets are those of that .pte; on another layout the case still checks the properties.
REGRESSIONS = [
    ("pte-bit-aborts-the-runtime", _flip(PTE, 1195965, 7, layout_bound=True), "decode verify", "crashed the ExecuTorch runtime (SIGABRT)"),
    ("bpte-bit-segfaults-the-runtime", _flip(BPTE, 290, 0), "verify", "crashed the ExecuTorch runtime (SIGSEGV)"),
    ("bpte-bit-aborts-the-runtime", _flip(BPTE, 2074023, 7, layout_bound=True), "verify", "crashed the ExecuTorch runtime (SIGABRT)"),
    ("bpte-offset-byte-segfaults-verify", _flip(BPTE, 128, 0), "verify", "crashed the ExecuTorch runtime (SIGSEGV)"),
    ("manifest-model-id-nudged", lambda case: manifest_edit(lambda m: m["model"].update(id=m["model"]["id"] + "_x"))(
        case.root), "verify-by-manifest", "manifest.json: $.model.id: "),
    ("manifest-backend-nudged", lambda case: manifest_edit(lambda m: m["programs"][0].update(backend="executorch_x"))(
        case.root), "decode verify", "$.programs[0].backend"),
    ("config-layer-scale-none", _config(layer_scale_initial_scale=None), "verify",
     "layer_scale_initial_scale must be a positive number"),
    ("config-layer-scale-1e308", _config(layer_scale_initial_scale=1e308), "verify",
     "layer_scale_initial_scale must be a positive number up to 3.403e+38"),
    ("pte-weight-bit-makes-nan-state", _flip(PTE, 11144, 0, layout_bound=True), "decode", "returned a non-finite value"),
    ("pte-cut-to-one-byte-logs-natively", _truncate(PTE, 1), "decode verify", "Failed to load program"),
    ("pt-codes-pickle-a-class", _codes_pt(__import__("argparse").Namespace(codes=1)), "decode",
     "Unsupported global: GLOBAL argparse.Namespace"),
    ("config-codebook-size-2-to-the-63", _config(codebook_size=2 ** 63), "verify",
     "codebook_size must be in 1..2147483647"),
    ("config-codebook-size-1-lists-mismatches", _config(codebook_size=1), "verify",
     "does not match the decoder config: 32 shape mismatches"),
    ("manifest-tolerance-why-deleted", lambda case: manifest_edit(lambda m: m["programs"][0]["tolerance"].pop("why"))(
        case.root), "verify-warns", "$.programs[0].tolerance.why"),
]

FIXES = {  # case -> how it was fixed (reports/fuzz.md)
    "pte-bit-aborts-the-runtime": "ship/probe.py: each .pte is loaded and run once in a child process first; a child "
                                  "killed by a signal is one line naming the file, and the file never runs here",
    "bpte-bit-segfaults-the-runtime": "verify runs the .bpte vectors only in a child process (probe.in_child): a FAIL "
                                      "row naming the signal",
    "bpte-bit-aborts-the-runtime": "as above",
    "pte-weight-bit-makes-nan-state": "Runner.run refuses a non-finite output (audio or state) naming the method and "
                                      "file; it was blamed on the next call's input state",
    "pte-cut-to-one-byte-logs-natively": "the runtime's log lines (load_program, execute) are kept off stderr "
                                         "(flows.native_quiet, Python's sys.stderr too)",
    "pt-codes-pickle-a-class": "read_codes keeps torch's reason only; the CLI prints any message in one line",
    "config-codebook-size-2-to-the-63": "config integers are bounded (1..2**31-1); it was a TypeError traceback",
    "config-codebook-size-1-lists-mismatches": "the shapes the config implies are checked against the safetensors "
                                               "header (a meta-device decoder) before anything is allocated, in one line",
    "bpte-offset-byte-segfaults-verify": "the child survived reading where the flipped offset pointed and verify "
                                         "did not (a probe then a second run in this process): now the vectors run only "
                                         "in the child",
    "manifest-model-id-nudged": "verify names the manifest's $.model.id when the model it names cannot be found",
    "manifest-backend-nudged": "the schema enumerates the backends (a test keeps it equal to the flows that write "
                               "files); it was 'unknown flow' without the file",
    "config-layer-scale-none": "every float of the config is checked (a positive number up to float32's largest) and "
                               "attention_bias is a bool; a decoder the config still cannot build is one line naming "
                               "config.json",
    "config-layer-scale-1e308": "as above (it overflowed the float32 parameter it initialises)",
    "manifest-tolerance-why-deleted": "verify read the recorded tolerance with Tolerance(**...) and raised a TypeError "
                                      "traceback; it reads the two numbers the schema requires, and `why` is marked a "
                                      "record in the schema (a WARN row when absent)",
    "decode-variant-both": "argparse errors in one line (cli._Parser)",
    "verify-windows-minus-one": "--windows (and --runs) take 1..1000; it was 'max() arg is an empty sequence'",
}


@pytest.mark.parametrize("damage,commands,says", cases(REGRESSIONS))
def test_counterexamples_found(clean_cli, et_artifacts, model_dir, damage, commands, says):
    with Case(clean_cli, et_artifacts, Path(model_dir)) as case:
        if getattr(damage, "layout_bound", False) and not hashlib.sha256(
                (case.root / PTE).read_bytes()).hexdigest().startswith(FUZZED_PTE):
            damage(case)  # the offset lands elsewhere in this layout: the properties only
            if "decode" in commands:
                rc, out, err = case.decode()
                rc = clean((rc, out, err), (PTE, "codes.pt", "manifest.json"), "decode")
                assert rc in (0, 2) and case.wav.exists() == (rc == 0), err
            if "verify" in commands:
                assert clean(case.verify(), (PTE, "config.json", "model.safetensors", "manifest.json"), "verify") in (0, 1, 2)
            return
        damage(case)
        if "decode" in commands:
            rc, out, err = case.decode()
            assert clean((rc, out, err), (PTE, "codes.pt", "manifest.json"), "decode") == 2 and says in err, err
            assert not case.wav.exists()
        if commands == "verify-by-manifest":  # the model the manifest names
            case.model = None
        if commands == "verify-warns":  # nothing wrong that a reader needs: it passes, and says what is absent
            rc, out, err = case.verify()
            assert clean((rc, out, err), ("manifest.json",), "verify") == 0 and says in out and "WARN" in out, out + err
            return
        if "verify" in commands:
            rc, out, err = case.verify()
            assert clean((rc, out, err), (PTE, "config.json", "model.safetensors", "manifest.json"), "verify") in (1, 2), out
            assert says in (err if rc == 2 else out), out + err


def test_the_schema_names_every_flow_that_writes_files():
    """The manifest schema's backend enum (manifest-backend-nudged: an unknown flow named no file)
    is the flows that write artifacts, so neither can change alone."""
    from c2w_export.program.flows import FLOWS
    from c2w_export.ship.manifest import schema

    assert schema()["$defs"]["program"]["properties"]["backend"]["enum"] == sorted(
        name for name, f in FLOWS.items() if f.writes_files)


OPTION_REGRESSIONS = [  # (id, argv after the artifacts, the line)
    ("decode-variant-both", ["decode", "--variant", "both"], "argument --variant: invalid choice: 'both'"),
    ("verify-windows-minus-one", ["verify", "--windows", "-1"], "argument --windows: -1 is not in 1..1000"),
]


@pytest.mark.parametrize("argv,says", cases(OPTION_REGRESSIONS))
def test_option_counterexamples(et_artifacts, tmp_path, argv, says):
    extra = ["--codes", str(tmp_path / "c.npy"), "--out", str(tmp_path / "o.wav")] if argv[0] == "decode" else []
    rc, _, err = cli_in_process([argv[0], "--artifacts", str(et_artifacts), *extra, *argv[1:]])
    assert rc == 2 and err.count("\n") == 1 and err.startswith("c2w-export: error: ") and says in err, err


def test_in_child_returns_the_value_or_why_the_child_died():
    from c2w_export.ship.probe import in_child

    assert in_child(lambda n: {"n": n}, 3) == ({"n": 3}, None)
    assert in_child(_abort) == (None, "crashed the ExecuTorch runtime (SIGABRT)")
    assert in_child(lambda: 1 / 0) == (None, "failed in a child process")


def test_a_child_computes_after_this_process_used_openmp_threads():
    """A fork holds only the thread that forked: after the parent computed on OpenMP's threads, a
    parallel op in the child waited for them until the timeout (the hang a serial, randomly ordered
    run met in a probe's Method.execute). In a fresh process on two threads, whatever this worker
    runs on: a sum large enough to be split across threads, computed in the child."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import torch
        from c2w_export.ship.probe import in_child
        torch.set_num_threads(2)
        torch.randn(1000, 1000) @ torch.randn(1000, 1000)  # OpenMP's threads start here
        print(in_child(lambda: float(torch.ones(4_000_000).sum()), timeout=30))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.stdout.strip().splitlines()[-1:] == ["(4000000.0, None)"], p.stdout[-2000:] + p.stderr[-2000:]


def _abort(*_):
    os.abort()


def _hang(*_):
    import time

    time.sleep(60)


@pytest.mark.parametrize("fn,says", [pytest.param(_abort, "crashed the ExecuTorch runtime (SIGABRT)", id="abort"),
                                     pytest.param(_hang, "did not finish in 2 s (hung)", id="hang")])
def test_the_probe_reports_a_child_that_dies_or_hangs(monkeypatch, tmp_path, fn, says):
    """The gate on the gate: a child killed by a signal, or one that never ends, is reported, and a
    child that lives (its Python errors are this process's to report) is not."""
    from c2w_export.ship import probe

    monkeypatch.setattr(probe, "_run_program", fn)
    assert probe.probe_program(tmp_path / "x.pte", {}, timeout=2) == says
    monkeypatch.setattr(probe, "_run_program", lambda *_: 1 / 0)
    assert probe.probe_program(tmp_path / "x.pte", {}, timeout=2) is None
