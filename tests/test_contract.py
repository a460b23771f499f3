"""Nothing passes verify that decode refuses (issue 32): structure-aware mutations of a shipped
manifest (torch_export, tiny, both variants), each run through the CLI's verify and decode in this
process. Every mutation of the published contract fails verify; decode refuses what it cannot
serve; neither ever shows a traceback; a record-only field deleted is a warning."""

import json
import math

import numpy as np
import pytest

from helpers import cases, cli_in_process, manifest_edit

STATEFUL, WINDOWED = 1, 0  # the programs' order in the torch_export fixture (windowed first)


def _set(*path_value):
    *path, value = path_value

    def edit(m):
        node = m
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value
    return edit


def _del(*path):
    def edit(m):
        node = m
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]
    return edit


def _dup_state(i):
    return lambda m: m["state"].insert(i, dict(m["state"][i]))


def _swap_state(m):
    m["state"][1], m["state"][2] = m["state"][2], m["state"][1]


CONTRACT = [  # (id, edit): the published I/O contract changed; verify must fail
    ("state-entry-deleted", _del("state", 3)),
    ("state-entry-duplicated", _dup_state(3)),
    ("state-order-swapped", _swap_state),
    ("state-dim-deleted", lambda m: m["state"][3]["shape"].pop()),
    ("state-dim-changed", _set("state", 3, "shape", lambda s: [7, *s[1:]])),
    ("state-dim-duplicated", lambda m: m["state"][3]["shape"].append(m["state"][3]["shape"][-1])),
    ("state-renamed", _set("state", 2, "name", "decoder.x")),
    ("state-dtype", _set("state", 2, "dtype", "float16")),
    ("program-input-deleted", lambda m: m["programs"][STATEFUL]["inputs"].pop(3)),
    ("program-input-dim-changed", _set("programs", STATEFUL, "inputs", 3, "shape", lambda s: [7, *s[1:]])),
    ("program-input-renamed", _set("programs", STATEFUL, "inputs", 2, "name", "renamed")),
    ("program-output-renamed", _set("programs", WINDOWED, "outputs", 0, "name", "audio")),
    ("state-output-renamed", _set("programs", STATEFUL, "outputs", 2, "name", "renamed")),
    ("codes-dtype", _set("programs", WINDOWED, "inputs", 0, "dtype", "int32")),
    ("history-shape", _set("programs", WINDOWED, "inputs", 1, "shape", [2])),
    ("wav-per-chunk", _set("programs", STATEFUL, "outputs", 0, "per_chunk", 960)),
    ("chunk-axis-dropped", lambda m: [m["programs"][0]["inputs"][0].pop(k) for k in ("chunk_axis", "per_chunk")]),
    ("hop", _set("decode", "hop", 960)),
    ("sample-rate", _set("decode", "sample_rate", 16000)),
    ("num-quantizers", _set("decode", "num_quantizers", 8)),
    ("codebook-size", _set("decode", "codebook_size", 1024)),
    ("decode-max-chunk", _set("decode", "max_chunk", 3)),
    ("program-max-chunk", _set("programs", STATEFUL, "max_chunk", 25)),
    ("program-min-chunk", _set("programs", STATEFUL, "min_chunk", 2)),
    ("program-context", _set("programs", WINDOWED, "context", 8)),
    ("decode-context", _set("decode", "context_frames", 8)),
    ("variants-short", _set("decode", "variants", ["windowed"])),
    ("variant-swapped", _set("programs", WINDOWED, "variant", "stateful")),
    ("method-renamed", _set("programs", WINDOWED, "method", "chunk_4")),
    ("ramp-past-max", _set("decode", "ramp", [2, 50])),
    ("extra-program-field", _set("programs", WINDOWED, "inputs", 0, "scale", 2)),
]

ODD = [  # (id, edit): odd values anywhere; refused with one line (exit 2), no traceback
    ("none", _set("decode", "hop", None)),
    ("negative", _set("programs", WINDOWED, "max_chunk", -1)),
    ("two-to-the-63", _set("decode", "context_frames", 2 ** 63)),
    ("nan", _set("programs", WINDOWED, "tolerance", "max_abs", math.nan)),
    ("empty-id", _set("model", "id", "")),
    ("long-name", _set("state", 0, "name", "x" * 5000)),
    ("path-traversal", _set("programs", WINDOWED, "path", "../../etc/passwd")),
    ("no-programs", _set("programs", [])),
    ("empty-decode", _set("decode", {})),
    ("state-not-a-list", _set("state", {})),
    ("version-a-string", _set("format_version", "3")),
    ("bad-sha256", _set("programs", WINDOWED, "sha256", "xyz")),
    ("bool-for-int", _set("decode", "hop", True)),
    ("float-for-int", _set("decode", "max_chunk", 4.0)),
]

RECORDS = [  # (id, edit, the JSON path verify warns about): a record only; verify passes, warning
    ("parity-deleted", _del("programs", WINDOWED, "parity"), "$.programs[0].parity"),
    ("graph-deleted", _del("programs", STATEFUL, "graph"), "$.programs[1].graph"),
    ("versions-deleted", _del("versions"), "$.versions"),
]


def _both(root, tmp_path):  # the agreement property: each case below asserts verify fails whenever decode refuses
    """(verify, decode) of `root`, each (returncode, stdout, stderr), in this process."""
    np.save(tmp_path / "codes.npy", np.zeros((16, 5), np.int64))
    verify = cli_in_process(["verify", "--artifacts", str(root), "--windows", "1"])
    decode = cli_in_process(["decode", "--artifacts", str(root), "--codes", str(tmp_path / "codes.npy"),
                             "--out", str(tmp_path / "out.wav")])
    return verify, decode


def _no_traceback(*results):
    for rc, so, se in results:
        assert "Traceback" not in se and rc in (0, 1, 2), (rc, se[-2000:])


def _mutated(artifacts, copy_of, tmp_path, edit):
    """(verify, decode) of a copy of `artifacts` with `edit` applied to its manifest; neither crashed."""
    root = copy_of(artifacts)
    manifest_edit(edit)(root)
    verify, decode = _both(root, tmp_path)
    _no_traceback(verify, decode)
    return verify, decode


@pytest.mark.parametrize("edit", cases([(i, e) for i, e in CONTRACT]))
def test_verify_fails_every_change_of_the_published_contract(artifacts, copy_of, tmp_path, edit):
    (vrc, vso, vse), _ = _mutated(artifacts, copy_of, tmp_path, edit)
    assert vrc in (1, 2), vso[-2000:] + vse[-2000:]  # verify fails: 2 (refused to read) or 1 (a failing row)
    if vrc == 2:
        assert len(vse.strip().splitlines()) == 1 and "manifest.json" in vse, vse
    else:
        assert "FAIL" in vso and "contract" in vso, vso


@pytest.mark.parametrize("edit", cases([(i, e) for i, e in ODD]))
def test_odd_values_are_refused_in_one_line(artifacts, copy_of, tmp_path, edit):
    (vrc, _, vse), (drc, _, dse) = _mutated(artifacts, copy_of, tmp_path, edit)
    assert vrc == 2 and drc == 2, (vse, dse)
    assert len(vse.strip().splitlines()) == 1 and "manifest.json" in vse, vse
    assert not (tmp_path / "out.wav").exists()


@pytest.mark.parametrize("edit,path", cases(RECORDS))
def test_a_record_deleted_is_a_warning(artifacts, copy_of, tmp_path, edit, path):
    root = copy_of(artifacts)
    manifest_edit(edit)(root)
    (vrc, vso, vse), (drc, dso, dse) = _both(root, tmp_path)
    assert vrc == 0 and drc == 0, (vso[-2000:], vse, dse)
    assert any(line.startswith("record") and path in line and line.rstrip().endswith("WARN  absent (a record only: "
                                                                                       "nothing reads it)")
               for line in vso.splitlines()), vso


def test_a_contract_mismatch_against_the_program_itself(et_artifacts, copy_of, tmp_path):
    """A manifest edited consistently (state and both programs' specs agree with each other) still
    contradicts the .pte's own method metadata: decode refuses it naming the field; verify fails it
    against the checkpoint first (its contract row)."""
    root = copy_of(et_artifacts)

    def edit(m):
        m["state"][3]["shape"][0] = 2
        for p in m["programs"]:
            if p["variant"] == "stateful":
                p["inputs"][4]["shape"][0] = 2
                p["outputs"][4]["shape"][0] = 2
    manifest_edit(edit)(root)
    (vrc, vso, vse), (drc, _, dse) = _both(root, tmp_path)
    assert drc == 2 and "the program's stateful takes float32 [1, " in dse and "$.programs[" in dse, dse
    assert vrc == 1 and "contract   manifest vs checkpoint" in vso and "FAIL" in vso, vso + vse


def _claims(path, shape):
    """A .npy of 16 x 5 zeros whose header claims `shape` (the data stays 640 bytes)."""
    np.save(path, np.zeros((16, 5), np.int64))
    data = path.read_bytes()
    n = int.from_bytes(data[8:10], "little")
    header = data[10:10 + n].decode().replace("(16, 5)", str(tuple(shape))).rstrip()
    path.write_bytes(data[:10] + (header + " " * (n - len(header) - 1) + "\n").encode() + data[10 + n:])
    return path


def _outside(root, tmp_path):
    """The first program file replaced by a symlink to an identical copy outside the directory."""
    import shutil

    rel = json.loads((root / "manifest.json").read_text())["programs"][0]["path"]
    shutil.copy(root / rel, tmp_path / "elsewhere")
    (root / rel).unlink()
    (root / rel).symlink_to(tmp_path / "elsewhere")


LIMITS = [  # (id, damage to the artifacts or codes, the line): refused before anything large is allocated
    ("codes-header-claims-a-huge-shape", lambda root, tmp: _claims(tmp / "codes.npy", (16, 10 ** 7)),
     "claims shape [16, 10000000], over the limit of 16000000 codes"),
    ("manifest-over-its-size-limit",
     lambda root, tmp: manifest_edit(lambda m: m["versions"].__setitem__("padding", "x" * (9 << 20)))(root),
     "over the 8388608-byte limit"),
    ("symlink-out-of-the-directory", _outside, "outside the artifacts directory"),
]


@pytest.mark.parametrize("damage,message", cases(LIMITS))
def test_limits_before_allocation(artifacts, copy_of, tmp_path, damage, message):
    root = copy_of(artifacts)
    np.save(tmp_path / "codes.npy", np.zeros((16, 5), np.int64))
    damage(root, tmp_path)
    decode = cli_in_process(["decode", "--artifacts", str(root), "--codes", str(tmp_path / "codes.npy"),
                             "--out", str(tmp_path / "out.wav")])
    _no_traceback(decode)
    assert decode[0] == 2 and message in decode[2], decode[2]
    assert not (tmp_path / "out.wav").exists()
    if "codes" not in message:
        verify = cli_in_process(["verify", "--artifacts", str(root), "--windows", "1"])
        assert verify[0] == 2 and message in verify[2], verify[2]
