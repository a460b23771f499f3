"""The conformance plugin (c2w_export.conformance), run with pytest's `pytester` as a team runs it:
`pytest --c2w-artifacts DIR --c2w-model M --junitxml X` in a fresh process, in a directory of its
own, on the XNNPACK artifacts (one .pte holding both variants, bundled vectors, ramp 2).

A fresh export passes every check, each named in the JUnit XML. Each damage fails exactly the test
ids that read what was damaged, and every other test passes. Without --c2w-artifacts the plugin
collects nothing."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from c2w_export.conformance.plugin import NODE_PREFIX
from helpers import cases, manifest_edit, rehash

PTE, BPTE = "code2wav.pte", "code2wav.bpte"
CHUNKS = (1, 2, 25)  # plugin.chunks: both ends of 1..25 and the ramp's 2


def ids(variants=("windowed", "stateful"), model="model") -> set[str]:
    """Every test id the plugin collects on these artifacts."""
    out = {"test_manifest[manifest.json]", f"test_model[{model}]", f"test_file[{PTE}]", f"test_file[{BPTE}]",
           f"test_methods[{PTE}]"}
    for v in variants:
        out |= {f"test_contract[{PTE}::{v}]", f"test_upstream[{PTE}::{v}]", f"test_bundle[{BPTE}::{v}]",
                f"test_stream[{v}]", f"test_stream_irregular[{v}]", *(f"test_windows[{PTE}::{v}::chunk={n}]" for n in CHUNKS)}
    return out


def runs(variant: str) -> set[str]:
    """The tests that run `variant`'s program against a reference."""
    return {f"test_upstream[{PTE}::{variant}]", f"test_stream[{variant}]", f"test_stream_irregular[{variant}]",
            *(f"test_windows[{PTE}::{variant}::chunk={n}]" for n in CHUNKS)}


@pytest.fixture(scope="module")
def model(model_dir, tmp_path_factory) -> Path:
    """The session checkpoint under a fixed name (the test_model id is its directory's name)."""
    out = tmp_path_factory.mktemp("conformance") / "model"
    shutil.copytree(model_dir, out)
    return out


@pytest.fixture(scope="module")
def other_pte(precision_artifacts) -> Path:
    """Programs of the same shapes and contract that compute something else: the fp16 XNNPACK programs of
    the same checkpoint (float32 I/O, ~1e-3 from float32, far over the fp32 gate on every CPU), exported
    once per session and shared with test_precision."""
    return precision_artifacts("fp16") / PTE


def conformance(pytester, root: Path, model: Path, *extra: str) -> dict[str, str]:
    """Run the plugin in a fresh process -> {test id: passed|failed|skipped}, from its JUnit XML."""
    xml = pytester.path / "conformance.xml"
    result = pytester.runpytest_subprocess("--c2w-artifacts", str(root), "--c2w-model", str(model), "--c2w-examples",
                                           "1", f"--junitxml={xml}", "-p", "no:cacheprovider", "--noconftest",
                                           "-W", "ignore", *extra, timeout=900)
    assert xml.exists(), result.stdout.str() + result.stderr.str()
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        assert case.get("classname") == NODE_PREFIX.removesuffix(".py::"), case.attrib
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        out[case.get("name")] = {"failure": "failed", "error": "failed"}.get(outcome, outcome)
    return out


def test_a_fresh_export_passes_every_check_each_named_in_junit(pytester, et_artifacts, model):
    outcomes = conformance(pytester, et_artifacts, model)
    assert outcomes == {i: "passed" for i in ids()}


def _flip(root: Path) -> None:
    data = bytearray((root / PTE).read_bytes())
    data[len(data) // 2] ^= 0x10
    (root / PTE).write_bytes(bytes(data))


def _swap(other: Path):
    def apply(root: Path) -> None:
        shutil.copy(other, root / PTE)
        rehash(root, PTE)
    return apply


def _extra_method(root: Path) -> None:
    """The manifest no longer names the windowed method its .pte still holds."""
    def edit(m):
        m["programs"] = [p for p in m["programs"] if p["variant"] == "stateful"]
        m["decode"]["variants"] = ["stateful"]
    manifest_edit(edit)(root)


def _state_shape(root: Path) -> None:
    """One state tensor one frame longer, everywhere the manifest publishes it (self-consistent)."""
    def edit(m):
        i = next(i for i, s in enumerate(m["state"]) if len(s["shape"]) == 3)
        m["state"][i]["shape"][-1] += 1
        for p in m["programs"]:
            if p["variant"] == "stateful":
                p["inputs"][1 + i]["shape"][-1] += 1
                p["outputs"][1 + i]["shape"][-1] += 1
    manifest_edit(edit)(root)


DAMAGE = cases([
    # (id, damage, the variants still published, the ids that must fail)
    ("swapped-program-behind-a-rehashed-manifest", "swap", ("windowed", "stateful"), runs("windowed") | runs("stateful")),
    ("flipped-byte", _flip, ("windowed", "stateful"),
     {f"test_file[{PTE}]", f"test_methods[{PTE}]", f"test_contract[{PTE}::windowed]", f"test_contract[{PTE}::stateful]"}
     | runs("windowed") | runs("stateful")),
    ("extra-method", _extra_method, ("stateful",), {f"test_methods[{PTE}]"}),
    ("missing-bundle", lambda root: (root / BPTE).unlink(), ("windowed", "stateful"),
     {f"test_file[{BPTE}]", f"test_bundle[{BPTE}::windowed]", f"test_bundle[{BPTE}::stateful]"}),
    ("wrong-state-shape", _state_shape, ("windowed", "stateful"), {f"test_contract[{PTE}::stateful]"} | runs("stateful")),
])


@pytest.mark.parametrize("damage, variants, failing", DAMAGE)
def test_each_damage_fails_exactly_its_ids(request, pytester, et_artifacts, model, tmp_path, damage, variants, failing):
    root = shutil.copytree(et_artifacts, tmp_path / "artifacts")
    (_swap(request.getfixturevalue("other_pte")) if damage == "swap" else damage)(root)
    outcomes = conformance(pytester, root, model)
    assert set(outcomes) == ids(variants)
    assert {i for i, o in outcomes.items() if o != "passed"} == failing, outcomes


def test_an_unreadable_manifest_is_one_failing_test(pytester, et_artifacts, model, tmp_path):
    root = shutil.copytree(et_artifacts, tmp_path / "artifacts")
    (root / "manifest.json").write_text("{not json")
    assert conformance(pytester, root, model) == {"test_manifest[manifest.json]": "failed"}


def test_without_the_option_the_plugin_collects_nothing(pytester):
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--noconftest")
    result.assert_outcomes(passed=1)
    assert "c2w conformance" not in result.stdout.str()
    assert "c2w_conformance" not in result.stdout.str()
