"""The command line as a shipping pipeline uses it: export, verify, decode, and a matrix of bad
input where each case gets a clear message and exit code 2 (runtime cases in a subprocess, so a
crash would show as a failure)."""

import json
import os
import shutil
import subprocess
import sys
import wave

import numpy as np
import pytest
import torch

from c2w_export import cli
from c2w_export.ship import manifest as mf
from helpers import RAMP, c2w, cases, manifest_edit


# ---------------------------------------------------------------- the happy path
def test_manifest_v3_contents(artifacts, model_dir):
    """The manifest against what it describes, measured independently: the hashes of the
    checkpoint's own files (config canonicalised by json, not by DecoderConfig), the files on disk."""
    import hashlib
    from pathlib import Path

    from c2w_export.program.flows import FLOWS

    m = mf.load(artifacts)
    assert m["format_version"] == 3
    assert m["decode"] == {"variants": ["windowed", "stateful"], "ramp": [2, 4], "ramp_reason": "given to export with --ramp",
                           "max_chunk": 4, "context_frames": 72, "hop": 1920, "sample_rate": 24000, "num_quantizers": 16,
                           "codebook_size": 2048}
    st = Path(model_dir) / "speech_tokenizer"
    config = json.loads((st / "config.json").read_text())
    assert m["model"]["config_sha256"] == hashlib.sha256(
        json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert m["model"]["weights_sha256"] == hashlib.sha256((st / "model.safetensors").read_bytes()).hexdigest()
    assert [p["method"] for p in m["programs"]] == ["windowed", "stateful"]
    assert [(p["min_chunk"], p["max_chunk"]) for p in m["programs"]] == [(1, 4), (1, 4)]
    for p in m["programs"]:
        path = artifacts / p["path"]
        assert not os.path.isabs(p["path"]) and path.is_file()
        assert p["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and p["bytes"] == path.stat().st_size
        assert p["verified"] is True and p["backend"] == "torch_export"
        assert p["parity"]["windows"] >= 3 and p["parity"]["streams"] >= 1
        assert list(p["parity"]["stages"]) == FLOWS["torch_export"].compared
    stateful = m["programs"][1]
    assert [s["name"] for s in stateful["inputs"]][:2] == ["codes", "pos"]
    assert [s["name"] for s in m["state"]] == [s["name"] for s in stateful["inputs"][1:]]
    assert [s["name"] for s in m["programs"][0]["inputs"]] == ["codes", "history"]  # the exact windowed start
    # the chunk axis, named: codes [1, 16, 72 + chunk], wav [1, chunk * 1920]; the state has none
    windowed = m["programs"][0]
    assert windowed["inputs"][0] == {"name": "codes", "shape": [1, 16, 76], "dtype": "int64", "chunk_axis": 2, "per_chunk": 1}
    assert windowed["outputs"][0] == {"name": "wav", "shape": [1, 4 * 1920], "dtype": "float32", "chunk_axis": 1,
                                      "per_chunk": 1920}
    assert all("chunk_axis" not in s for s in stateful["inputs"][1:])


def test_verify_passes_with_table_and_json(artifacts):
    rc, so, se = c2w("verify", "--artifacts", artifacts)
    assert rc == 0, so + se
    assert "verify: PASS" in so and "stream" in so and "stateful" in so
    rc, so, se = c2w("verify", "--artifacts", artifacts, "--json")
    assert rc == 0
    result = json.loads(so)
    assert result["passed"] and {r["check"] for r in result["rows"]} >= {"hashes", "model", "windows", "stream"}


def test_verify_runs_bundled_vectors(et_artifacts):
    rc, so, se = c2w("verify", "--artifacts", et_artifacts)
    assert rc == 0, so + se
    assert so.count("via bundled API") == 2, so


def test_verify_bundle_and_method_rows(et_artifacts, copy_of):
    """verify's method-name and bundle checks, called directly (fast): windowed bundles at atol
    only, the stateful chain also at BUNDLE_STATE_RTOL; a program listed without a bundle is passed
    over and the bundles after it still run; a manifest that records more vectors than the .bpte
    holds fails that method's row with the runtime's error, and the other method still passes."""
    from c2w_export.ship.artifacts import open_artifacts
    from c2w_export.ship.checks import Subject, method_rows, verify_bundles

    art = open_artifacts(et_artifacts)
    assert [(r.target, r.passed, r.detail) for r in method_rows(Subject(et_artifacts), "code2wav.pte")] == [
        ("code2wav.pte", True, "2 method(s) by name")]
    second = art.manifest["programs"][1]["method"]
    rows = verify_bundles(art)
    assert [(r.check, r.target, r.passed, r.detail) for r in rows] == [
        ("bundle", "windowed", True, "2 vector(s) via bundled API (atol 3e-05, rtol 0)"),
        ("bundle", "stateful", True, "2 vector(s) via bundled API (atol 3e-05, rtol 0.0001)")], rows
    root = copy_of(et_artifacts)
    manifest_edit(lambda m: m["programs"][0].pop("bundle"))(root)
    assert [r.target for r in verify_bundles(open_artifacts(root))] == [second]
    manifest_edit(lambda m: m["programs"][1]["bundle"].__setitem__("cases", 3))(root)
    (bad,) = verify_bundles(open_artifacts(root))
    assert (bad.check, bad.target, bad.passed, bad.diff, bad.tolerance) == ("bundle", second, False, None, None)
    assert bad.detail.startswith("bundled vectors failed (atol 3e-05, rtol 0.0001): RuntimeError: "), bad.detail


def test_manifest_records_each_methods_memory_plan(et_artifacts):
    """Each XNNPACK method's memory plan (read from the .pte) is in the manifest, and holds at least
    the method's planned inputs and outputs at the largest chunk (from the I/O contract, an
    independent count): a plan read from the wrong buffer, or not at all, fails."""
    from math import prod

    from c2w_export.ship.artifacts import open_artifacts

    art = open_artifacts(et_artifacts)
    for entry in art.manifest["programs"]:
        spec = art.specs[entry["method"]]
        io = sum(prod(t.shape) * t.torch_dtype.itemsize for t in (*spec.inputs, *spec.outputs))
        assert entry["memory"]["plan_bytes"] >= io > 0, (entry["method"], entry["memory"], io)


def test_profile_counts_what_the_graph_left_outside_the_delegate(et_artifacts):
    """The runtime's ETDump trace against the export's graph inspection (two independent counts):
    per method call, each portable kernel runs as often as the graph has that op outside the
    delegate, and the delegate is called once per partition. The op times add up to no more
    than the method's total."""
    from collections import Counter

    from c2w_export.report.profile import profile_method, profile_table
    from c2w_export.ship.artifacts import open_artifacts

    art = open_artifacts(et_artifacts)
    for entry in art.manifest["programs"]:
        rows = profile_method(art, entry["method"], runs=2)
        portable = Counter()
        for r in rows:
            if r.where == "portable":
                portable[r.op.split(".")[0]] += r.calls
        graph = entry["graph"]["delegation"]
        assert dict(portable) == graph["outside"], entry["method"]
        (calls,) = [r.calls for r in rows if r.op == "DELEGATE_CALL"]
        assert calls == graph["partitions"]
        total = next(r.ms for r in rows if r.op == "Method::execute")
        inside = [r for r in rows if r.where == "xnnpack"]
        assert inside and any(r.op.startswith("Convolution") for r in inside)
        assert 0 < sum(r.ms for r in rows if r.where != "runtime") <= 1.05 * total
        assert profile_table(entry["method"], rows).startswith(f"**{entry['method']}**: {total:.3f} ms per call")


PROFILE_ERRORS = [  # (id, artifacts fixture, extra args, message)
    ("unknown-method", "et_artifacts", ["--method", "chunk_9"], "no method 'chunk_9' in "),
    ("not-executorch", "artifacts", [], "holds no ExecuTorch .pte program to profile"),
    ("pt2-method", "artifacts", ["--method", "windowed"], "windowed is a torch_export program (code2wav_windowed.pt2): "
                                                          "only ExecuTorch .pte programs carry an ETDump profile"),
    ("zero-runs", "et_artifacts", ["--runs", "0"], "profile: argument --runs: 0 is not in 1..1000"),
]


@pytest.mark.parametrize("fixture,extra,message", cases(PROFILE_ERRORS))
def test_profile_refuses_by_name(request, fixture, extra, message):
    rc, so, se = c2w("profile", "--artifacts", request.getfixturevalue(fixture), *extra)
    assert rc == 2 and message in se and "Traceback" not in se, se


def test_profile_cli_json(et_artifacts):
    import json

    rc, so, se = c2w("profile", "--artifacts", et_artifacts, "--method", "stateful", "--runs", "1", "--json")
    assert rc == 0, se
    rows = json.loads(so)["stateful"]
    assert {r["where"] for r in rows} == {"xnnpack", "portable", "runtime"}


def test_export_prints_progress_per_program(et_artifacts):
    so = (et_artifacts.parent / "stdout.txt").read_text()
    assert "[1/2] executorch_xnnpack windowed (chunks 1..25)" in so and " MB, " in so, so


def test_multi_method_file_holds_every_method(et_artifacts):
    from executorch.runtime import Runtime

    m = mf.load(et_artifacts)
    assert {p["path"] for p in m["programs"]} == {"code2wav.pte"}
    assert set(Runtime.get().load_program(str(et_artifacts / "code2wav.pte")).method_names) == {"windowed", "stateful"}


@pytest.mark.parametrize("variant", ["stateful", "windowed"])
def test_decode_writes_wav_and_reports(artifacts, tmp_path, variant):
    codes = np.random.default_rng(0).integers(0, 2048, size=(16, 11), dtype=np.int64)
    np.save(tmp_path / "codes.npy", codes)
    rc, so, se = c2w("decode", "--artifacts", artifacts, "--codes", tmp_path / "codes.npy", "--out",
                     tmp_path / "out.wav", "--variant", variant, "--check")
    assert rc == 0, se
    assert "real-time factor" in so and "first chunk" in so and "check vs offline eager decode" in so
    assert "load " in so and "cold start" in so and "playback at 24 kHz from the first chunk: first audio" in so
    assert "underrun(s)" in so and "start-up buffer" in so
    with wave.open(str(tmp_path / "out.wav")) as w:
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (24000, 1, 11 * 1920)


def test_decode_stateful_check_is_exact(artifacts, tmp_path):
    torch.save(torch.randint(0, 2048, (1, 16, 9)), tmp_path / "codes.pt")
    rc, so, se = c2w("decode", "--artifacts", artifacts, "--codes", tmp_path / "codes.pt", "--out", tmp_path / "o.wav", "--check")
    assert rc == 0, se
    max_abs = float(so.split("check vs offline eager decode: max_abs=")[1].split()[0])
    assert max_abs < 3e-5


def test_decode_options_ramp_json_float_wav(artifacts, tmp_path, decoder):
    """--ramp runs that schedule (any sizes in the chunk range), --json gives the timings and the playback as one object, and
    --wav-format float32 writes the samples unrounded: read back by scipy (an independent WAV
    reader), they equal the offline eager decode within the fp32 gate, where 16-bit PCM cannot."""
    from scipy.io import wavfile

    from c2w_export.program.compare import compare
    from c2w_export.program.tolerances import tolerance

    codes = torch.randint(0, 2048, (1, 16, 9), generator=torch.Generator().manual_seed(3))
    torch.save(codes, tmp_path / "codes.pt")
    rc, so, se = c2w("decode", "--artifacts", artifacts, "--codes", tmp_path / "codes.pt", "--out", tmp_path / "f.wav",
                     "--ramp", "3", "--wav-format", "float32", "--json")
    assert rc == 0, se
    report = json.loads(so)
    assert report["ramp"] == [3] and report["wav_format"] == "float32" and report["variant"] == "stateful"
    assert [(s["start"], s["frames"]) for s in report["steps"]] == [(0, 3), (3, 3), (6, 3)]
    assert report["load_ms"] > 0 and all(s["ms"] > 0 for s in report["steps"])
    assert set(report["playback"]) == {"first_audio_ms", "underruns", "stall_ms", "startup_buffer_ms"}
    assert report["playback"]["first_audio_ms"] == report["steps"][0]["ms"]
    rate, samples = wavfile.read(tmp_path / "f.wav")
    assert rate == 24000 and samples.dtype == np.float32 and samples.shape == (9 * 1920,)
    with torch.no_grad():
        ref = decoder(codes)[:, 0]
    assert compare(torch.from_numpy(samples)[None], ref).within(tolerance("stateful_stream"))
    # the same ramp, so the two files differ by the 16-bit rounding alone (two ramps differ by float noise too)
    rc, so, se = c2w("decode", "--artifacts", artifacts, "--codes", tmp_path / "codes.pt", "--out", tmp_path / "p.wav",
                     "--ramp", "3")
    assert rc == 0, se
    rate, pcm = wavfile.read(tmp_path / "p.wav")
    assert pcm.dtype == np.int16 and np.abs(pcm / 32767.0 - samples).max() <= 0.5 / 32767 + 1e-6


BAD_DECODE_OPTIONS = [
    ("ramp-past-the-max", ["--ramp", "8"], "ramp [8] goes past the programs' largest chunk, 4 ("),
    ("ramp-zero", ["--ramp", "0"], "ramp must hold positive chunk sizes"),
    ("wav-format", ["--wav-format", "mp3"], "invalid choice: 'mp3'"),
]


@pytest.mark.parametrize("extra,message", cases(BAD_DECODE_OPTIONS))
def test_decode_bad_options(artifacts, tmp_path, extra, message):
    torch.save(torch.zeros(1, 16, 3, dtype=torch.int64), tmp_path / "codes.pt")
    rc, so, se = c2w("decode", "--artifacts", artifacts, "--codes", tmp_path / "codes.pt", "--out", tmp_path / "o.wav", *extra)
    assert rc == 2, (so, se)
    assert message in se and "Traceback" not in se
    assert not (tmp_path / "o.wav").exists()


# ---------------------------------------------------------------- bad input: exit 2, one clear line
def _codes_file(tmp_path, arr, name="codes.npy"):
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, arr)
    else:
        path.write_bytes(b"")
    return path


BAD_CODES = [
    ("out-of-range", lambda: np.full((16, 5), 2048, np.int64), "must lie in [0, 2048)"),
    ("negative", lambda: np.full((16, 5), -1, np.int64), "found -1"),
    ("float-dtype", lambda: np.zeros((16, 5), np.float32), "must be int64, got float32"),
    ("int32-dtype", lambda: np.zeros((16, 5), np.int32), "must be int64, got int32"),
    ("wrong-q", lambda: np.zeros((8, 5), np.int64), "Q=16"),
    ("zero-t", lambda: np.zeros((16, 0), np.int64), "T >= 1"),
    ("1d", lambda: np.zeros((16,), np.int64), "must have shape [Q, T]"),
    ("empty-file", None, "codes file is empty"),
]


@pytest.mark.parametrize("make,message", cases(BAD_CODES))
def test_decode_bad_codes(artifacts, tmp_path, make, message):
    path = _codes_file(tmp_path, make() if make else None, "codes.npy" if make else "empty.npy")
    if not make:
        path.write_bytes(b"")
    rc, so, se = c2w("decode", "--artifacts", artifacts, "--codes", path, "--out", tmp_path / "o.wav")
    assert rc == 2, (so, se)
    assert message in se and "Traceback" not in se
    assert not (tmp_path / "o.wav").exists()


def _truncate(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flip(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


BAD_ARTIFACTS = [
    ("truncated-pte", lambda r: _truncate(r / "code2wav.pte"), "truncated or replaced"),
    ("flipped-byte", lambda r: _flip(r / "code2wav.pte"), "sha256 mismatch"),
    ("missing-file", lambda r: (r / "code2wav.pte").unlink(), "missing artifact file code2wav.pte"),
    ("missing-field", manifest_edit(lambda m: m["decode"].pop("hop")), "manifest.json: $.decode: 'hop' is a required property"),
    ("wrong-type", manifest_edit(lambda m: m["programs"][0].__setitem__("max_chunk", "2")), "$.programs[0].max_chunk: '2' is not of type 'integer'"),
    ("format-version", manifest_edit(lambda m: m.__setitem__("format_version", 4)), "unknown format_version 4"),
    ("v1-manifest", manifest_edit(lambda m: m.__setitem__("format_version", 1)), "re-export"),
    ("v2-manifest", manifest_edit(lambda m: m.__setitem__("format_version", 2)),
     "v2 holds one method per chunk size, this c2w-export one per variant for every size: re-export"),
    ("no-ramp-reason", manifest_edit(lambda m: m["decode"].pop("ramp_reason")), "$.decode: 'ramp_reason' is a required property"),
    ("no-manifest", lambda r: (r / "manifest.json").unlink(), "no manifest.json"),
    ("not-json", lambda r: (r / "manifest.json").write_text("{"), "not valid JSON"),
    ("absolute-path", manifest_edit(lambda m: m["programs"][0].__setitem__("path", "/etc/passwd")), "must be relative"),
    ("dotdot-path", manifest_edit(lambda m: m["programs"][0].__setitem__("path", "../code2wav.pte")), "must be relative"),
    ("dotdot-bundle", manifest_edit(lambda m: m["programs"][0]["bundle"].__setitem__("path", "../x.bpte")), "must be relative"),
    ("damaged-bpte", lambda r: _flip(r / "code2wav.bpte"), "code2wav.bpte: sha256 mismatch"),
    ("unknown-precision", manifest_edit(lambda m: m.__setitem__("precision", {"name": "int4", "key": "int4"})),
     "unknown precision 'int4'"),
    ("precision-without-key", manifest_edit(lambda m: m.__setitem__("precision", {"name": "fp16"})),
     "$.precision: 'key' is a required property"),
]


@pytest.mark.parametrize("damage,message", cases(BAD_ARTIFACTS))
def test_verify_and_decode_reject_damaged_artifacts(et_artifacts, copy_of, tmp_path, damage, message):
    root = copy_of(et_artifacts)
    damage(root)
    rc, so, se = c2w("verify", "--artifacts", root)
    assert rc == 2, (so, se)
    assert message in se and "Traceback" not in se
    np.save(tmp_path / "c.npy", np.zeros((16, 3), np.int64))
    rc, so, se = c2w("decode", "--artifacts", root, "--codes", tmp_path / "c.npy", "--out", tmp_path / "o.wav")
    assert rc == 2 and message in se


def test_verify_refuses_a_precision_without_a_gate_for_its_backend(et_artifacts, copy_of):
    """A manifest that claims a precision this backend has no measured gate for is a usage error
    naming both, never a crash on a missing tolerance."""
    root = copy_of(et_artifacts)
    manifest_edit(lambda m: m.__setitem__("precision", {"name": "int8-linears", "key": "int8-linears"}))(root)
    rc, so, se = c2w("verify", "--artifacts", root)
    assert rc == 2 and "Traceback" not in se, (so, se)
    assert "precision int8-linears has no measured gate for executorch_xnnpack; it is gated for ['torch_export']" in se


STATE_SCRIPT = """
import sys, torch
from c2w_export.ship.artifacts import open_artifacts
from c2w_export.model.validate import InputError
art = open_artifacts(sys.argv[1])
state = list(art.initial_state())
state[3] = state[3].clone().fill_(float(sys.argv[2]))
try:
    art.programs().run("stateful", (torch.zeros(1, 16, 2, dtype=torch.int64), *state))
except InputError as e:
    print("InputError:", e)
    sys.exit(2)
"""


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nonfinite_state_is_reported_not_crashed(et_artifacts, value):
    p = subprocess.run([sys.executable, "-c", STATE_SCRIPT, str(et_artifacts), value], capture_output=True, text=True)
    assert p.returncode == 2, (p.stdout, p.stderr)  # a crash would be a negative (signal) code
    assert "non-finite value" in p.stdout


def _damage_ckpt(root, kind):
    from safetensors.torch import load_file, save_file

    w = root / "speech_tokenizer" / "model.safetensors"
    if kind == "truncated":
        _truncate(w)
    elif kind == "config":
        (root / "speech_tokenizer" / "config.json").write_text("{")
    else:
        t = load_file(w)
        if kind == "missing":
            t.pop("decoder.pre_conv.conv.bias")
        else:
            t["decoder.extra.weight"] = torch.zeros(1)
        save_file(t, w)


@pytest.mark.parametrize("kind,message", [("truncated", "truncated or not a safetensors"), ("config", "not valid JSON"),
                                          ("missing", "missing keys"), ("extra", "unexpected keys")],
                         ids=["truncated-safetensors", "broken-config", "missing-keys", "extra-keys"])
def test_bad_checkpoint_exits_2(model_dir, copy_of, tmp_path, artifacts, kind, message):
    from pathlib import Path

    root = copy_of(Path(model_dir))
    _damage_ckpt(root, kind)
    rc, so, se = c2w("export", "--model", root, "--out-dir", tmp_path / "out", "--backend", "torch_export", "--ramp", "2")
    assert rc == 2 and message in se and "Traceback" not in se, se
    assert not (tmp_path / "out" / "manifest.json").exists()
    rc, so, se = c2w("verify", "--artifacts", artifacts, "--model", root)
    assert rc == 2 and message in se


def test_usage_errors_exit_2(tmp_path):
    rc, so, se = c2w("export", "--model", tmp_path, "--out-dir", tmp_path / "o", "--ramp", "0")
    assert rc == 2 and "ramp must hold positive chunk sizes" in se
    rc, so, se = c2w("verify", "--artifacts", tmp_path / "nope")
    assert rc == 2 and "artifacts directory not found" in se


# ---------------------------------------------------------------- failures ship nothing
def test_verify_parity_failure_exits_1(artifacts, tmp_path):
    other = tmp_path / "other"
    assert cli.main(["synth", "--preset", "tiny", "--seed", "1", "--out", str(other)]) == 0
    rc, so, se = c2w("verify", "--artifacts", artifacts, "--model", other)
    assert rc == 1, so + se
    assert "different checkpoint" in so and "over tolerance" in so and "FAIL" in so


def _rehash(root, rel):
    """Record a replaced file's size and sha256 in the manifest, as an attacker would."""
    import hashlib

    def edit(m):
        for p in m["programs"]:
            data = (root / rel).read_bytes()
            if p["path"] == rel:
                p["sha256"], p["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
            if p.get("bundle", {}).get("path") == rel:
                p["bundle"]["sha256"] = hashlib.sha256(data).hexdigest()
    manifest_edit(edit)(root)


def test_verify_rejects_replaced_program_with_loosened_tolerance(artifacts, copy_of, tmp_path):
    """A program from another checkpoint, its sha256 and a loose tolerance written into the
    manifest: verify checks at the installed table's tolerance, names the method and the looser record."""
    other_model, other = tmp_path / "m1", tmp_path / "a1"
    assert cli.main(["synth", "--seed", "1", "--out", str(other_model)]) == 0
    assert cli.main(["export", "--model", str(other_model), "--out-dir", str(other), "--ramp", "2", "--max-chunk", "4",
                     "--backend", "torch_export"]) == 0
    root = copy_of(artifacts)
    shutil.copy(other / "code2wav_windowed.pt2", root / "code2wav_windowed.pt2")
    _rehash(root, "code2wav_windowed.pt2")
    manifest_edit(lambda m: [p.__setitem__("tolerance", {"max_abs": 10.0, "min_snr_db": -100.0, "why": "trust me"})
                              for p in m["programs"]])(root)
    rc, so, se = c2w("verify", "--artifacts", root, "--json")
    assert rc == 1, so + se
    rows = json.loads(so)["rows"]
    failed = {(r["check"], r["target"]) for r in rows if not r["passed"]}
    assert ("windows", "windowed") in failed and ("windows", "stateful") not in failed, failed
    assert ("tolerance", "windowed") in failed
    loose = next(r for r in rows if r["check"] == "tolerance")
    assert "looser tolerance" in loose["detail"] and loose["tolerance"]["max_abs"] == 3e-5


def test_verify_names_the_wrong_method_of_a_multi_method_pte(et_artifacts, copy_of, decoder, tmp_path):
    """One .pte whose stateful method comes from another checkpoint (hashes and bundle rewritten):
    its windows, stream and bundled vectors fail by name, the other method passes. The other
    checkpoint is the stress one, whose stateful XNNPACK program the session lowers anyway (the
    lowering cache): same shapes, other weights."""
    from c2w_export.program.flows import Export, Lower, SerializePte, Work
    from c2w_export.report.golden import golden_decoder
    from c2w_export.program.pipeline import ProgramResult
    from c2w_export.program.prepare import prepare
    from c2w_export.program.tolerances import tolerance
    from c2w_export.program.variants import example_inputs, make_variant
    from c2w_export.ship.bundle import write_bundles

    other = golden_decoder("tiny_stress_seed0")
    mods = {"windowed": make_variant(prepare(decoder), "windowed", 25, 72),  # prepared, as export does: the session has lowered it
            "stateful": make_variant(prepare(other), "stateful", 25, 72)}
    root = copy_of(et_artifacts)
    work = Work(mods, {m: example_inputs(v) for m, v in mods.items()}, root, "code2wav")
    SerializePte().run(Lower("xnnpack").run(Export().run(mods, work), work), work)
    results = [ProgramResult("executorch_xnnpack", m.spec(), root / "code2wav.pte", tolerance("executorch_xnnpack"))
               for m in mods.values()]
    write_bundles(results, lambda s: None, reference=decoder)  # expected outputs from the right decoder
    _rehash(root, "code2wav.pte")
    _rehash(root, "code2wav.bpte")
    rc, so, se = c2w("verify", "--artifacts", root, "--json")
    assert rc == 1, so + se
    rows = json.loads(so)["rows"]
    failed = {(r["check"], r["target"]) for r in rows if not r["passed"]}
    assert ("windows", "stateful") in failed and ("bundle", "stateful") in failed, failed
    assert ("windows", "windowed") not in failed and ("bundle", "windowed") not in failed, failed
    assert any(c == "stream" and t.startswith("stateful") for c, t in failed), failed


def test_verify_reports_an_extra_method(et_artifacts, copy_of):
    """A file holding a method the manifest does not name fails the 'methods' check by name."""
    root = copy_of(et_artifacts)
    manifest_edit(lambda m: m.__setitem__("programs", [p for p in m["programs"] if p["method"] != "stateful"]))(root)
    manifest_edit(lambda m: m["decode"].__setitem__("variants", ["windowed"]))(root)
    rc, so, se = c2w("verify", "--artifacts", root, "--json")
    assert rc == 1, so + se
    row = next(r for r in json.loads(so)["rows"] if r["check"] == "methods")
    assert not row["passed"] and "'stateful'" in row["detail"]


def test_over_tolerance_is_not_shipped(model_dir, tmp_path, monkeypatch, capsys):
    import c2w_export.program.pipeline as pl
    from c2w_export.program.tolerances import Tolerance

    monkeypatch.setattr(pl, "tolerance", lambda flow: Tolerance(-1.0, 1e9, "impossible, for this test"))
    rc = cli.main(["export", "--model", model_dir, "--out-dir", str(tmp_path), "--backend", "torch_export", "--ramp", "2"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "not shipped" in err and "torch_export windowed" in err and "max_abs=" in err
    assert list(tmp_path.iterdir()) == []


def test_failure_halfway_leaves_nothing(model_dir, tmp_path, monkeypatch, capsys):
    """The second program's serialize stage fails after the first program was written: nothing ships."""
    from c2w_export.program.flows import FlowError, SerializePt2

    calls = {"n": 0}
    real = SerializePt2.run

    def flaky(self, programs, work):
        calls["n"] += 1
        if calls["n"] == 2:
            raise FlowError("stage 'serialize' failed: injected")
        return real(self, programs, work)

    monkeypatch.setattr(SerializePt2, "run", flaky)
    rc = cli.main(["export", "--model", model_dir, "--out-dir", str(tmp_path), "--backend", "torch_export", "--ramp", "2", "4",
                   "--variant", "both"])
    assert rc == 2 and "injected" in capsys.readouterr().err
    assert calls["n"] == 2
    assert list(tmp_path.iterdir()) == [], "partial artifacts left behind"


def test_version_prints_what_a_manifest_records():
    """--version against the installed packages' own metadata (not env.versions()), exit 0."""
    import platform
    from importlib.metadata import version

    rc, so, se = c2w("--version")
    assert rc == 0, se
    assert so.startswith("c2w-export ") and f"torch {version('torch')}" in so, so
    assert f"executorch {version('executorch')}" in so and f"Python {platform.python_version()}" in so, so
    assert "fp16 arithmetic native-fp16" in so or "fp16 arithmetic fp32-accumulate" in so, so
