"""ExecuTorch BundledProgram (.bpte) test vectors: each method's example inputs and expected
(eager) outputs travel with the program, so a device build can check itself with the runtime's
bundled-program API (load_bundled_input -> plan_execute -> verify_result_with_bundled_expected_output)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from .checkpoint import sha256_file
from .fileio import atomic_write_bytes
from .flows import Flow, FlowError
from .pipeline import ProgramResult, parity_inputs
from .variants import Stateful

BUNDLE_CASES = 2  # test vectors per method


def _runtime():
    from executorch.extension.pybindings import portable_lib

    return portable_lib


def _cases(module) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """(inputs, expected outputs) pairs from the eager module; stateful cases chain the state."""
    codes = parity_inputs(module, BUNDLE_CASES, seed=4242)
    cases = []
    state = module.initial_state() if isinstance(module, Stateful) else ()
    for c in codes:
        inputs = [c, *state]
        with torch.no_grad():
            out = module(*inputs)
        out = list(out) if isinstance(out, tuple) else [out]
        cases.append((inputs, out))
        if isinstance(module, Stateful):
            state = tuple(out[1:])
    return cases


def write_bundles(flow: Flow, results: list[ProgramResult], root: Path, progress: Callable[[str], None]) -> dict[str, dict]:
    """One .bpte per .pte file, holding a test suite for each of its methods.
    Returns {method: {"path", "sha256", "cases"}}."""
    if not flow.is_executorch:
        raise FlowError("--bundle needs the executorch backend (BundledProgram wraps a .pte)")
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    by_file: dict[Path, list[ProgramResult]] = {}
    for r in results:
        by_file.setdefault(r.path, []).append(r)
    out = {}
    for pte, rs in by_file.items():
        suites = []
        for r in rs:
            module = r.module
            suites.append(MethodTestSuite(method_name=r.spec.method, test_cases=[
                MethodTestCase(inputs=i, expected_outputs=o) for i, o in _cases(module)]))
        try:
            bp = BundledProgram(None, suites, pte_file_path=str(pte))
            data = serialize_from_bundled_program_to_flatbuffer(bp)
        except Exception as e:
            raise FlowError(f"BundledProgram for {pte.name} failed: {type(e).__name__}: {e}") from e
        path = pte.with_suffix(".bpte")
        atomic_write_bytes(path, data)
        sha = sha256_file(path)
        for r in rs:
            out[r.spec.method] = {"path": path.name, "sha256": sha, "cases": BUNDLE_CASES}
        progress(f"bundled {len(rs)} method(s) x {BUNDLE_CASES} test vectors -> {path.name} ({path.stat().st_size / 1e6:.1f} MB)")
    return out


def verify_bundles(art) -> list:
    """Run each bundled vector through the runtime's bundled-program API
    (BundledModule.verify_result_with_bundled_expected_output executes the method on the
    bundled inputs and compares with the bundled expected outputs inside the runtime)."""
    from .tolerances import BUNDLE_STATE_RTOL
    from .verify import Row

    rt = _runtime()
    rows, loaded = [], {}
    for p in art.manifest["programs"]:
        b = p.get("bundle")
        if not b:
            continue
        atol = p["tolerance"]["max_abs"]
        rtol = BUNDLE_STATE_RTOL if p["variant"] == "stateful" else 0.0
        try:
            if b["path"] not in loaded:
                loaded[b["path"]] = rt._load_bundled_program_from_buffer((art.root / b["path"]).read_bytes())
            bundled = loaded[b["path"]]
            for i in range(b["cases"]):
                bundled.verify_result_with_bundled_expected_output(p["method"], i, rtol, atol)
            rows.append(Row("bundle", p["method"], None, None, True,
                            f"{b['cases']} vector(s) via bundled API (atol {atol:g}, rtol {rtol:g})"))
        except Exception as e:
            rows.append(Row("bundle", p["method"], None, None, False,
                            f"bundled vectors failed (atol {atol:g}, rtol {rtol:g}): {type(e).__name__}: {e}"))
    return rows
