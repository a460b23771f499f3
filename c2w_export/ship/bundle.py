"""Write ExecuTorch BundledProgram (.bpte) test vectors: each method's example inputs and expected
(eager) outputs travel with the program, so a device build can check itself with the runtime's
bundled-program API. `verify.verify_bundles` runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from ..fileio import atomic_write_bytes, sha256_file
from ..program.flows import FlowError
from ..program.pipeline import ProgramResult, parity_inputs
from ..model.decoder import Code2Wav
from ..program.variants import Stateful, Windowed, make_variant

BUNDLE_CASES = 2  # test vectors per method
BUNDLE_SEED = 4242


def bundle_cases(module: Windowed | Stateful, expected: Callable | None = None
                 ) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """(inputs, expected outputs) pairs: inputs for `module`'s contract, outputs computed by
    `expected` (default: the eager `module`; a reduced-precision program's own reference);
    stateful cases chain the state."""
    cases = []
    state = module.initial_state()
    for c in parity_inputs(module, BUNDLE_CASES, seed=BUNDLE_SEED):
        inputs = [*c, *state]
        with torch.no_grad():
            out = (expected or module)(*inputs)
        out = list(out) if isinstance(out, tuple) else [out]
        cases.append((inputs, out))
        state = tuple(out[1:])
    return cases


def write_bundles(results: Sequence[ProgramResult], progress: Callable[[str], None], reference: Code2Wav) -> dict[str, dict]:
    """One .bpte next to each .pte file, holding a test suite for each of its methods, with the
    expected outputs computed by the `reference` (eager) decoder, or by a reduced-precision program's
    own eager reference (at that precision), never by the program itself.
    Returns {method: {"path", "sha256", "cases"}}."""
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    by_file: dict[Path, list[ProgramResult]] = {}
    for r in results:
        by_file.setdefault(r.path, []).append(r)
    out = {}
    for pte, rs in by_file.items():
        suites = [MethodTestSuite(method_name=r.spec.method, test_cases=[
            MethodTestCase(inputs=i, expected_outputs=o)
            for i, o in bundle_cases(make_variant(reference, r.spec.variant, r.spec.max_chunk, r.spec.context), r.own)])
            for r in rs]
        try:
            data = serialize_from_bundled_program_to_flatbuffer(BundledProgram(None, suites, pte_file_path=str(pte)))
        except Exception as e:
            raise FlowError(f"BundledProgram for {pte.name} failed: {type(e).__name__}: {e}") from e
        path = pte.with_suffix(".bpte")
        atomic_write_bytes(path, data)
        sha = sha256_file(path)
        for r in rs:
            out[r.spec.method] = {"path": path.name, "sha256": sha, "cases": BUNDLE_CASES}
        progress(f"bundled {len(rs)} method(s) x {BUNDLE_CASES} test vectors -> {path.name} ({path.stat().st_size / 1e6:.1f} MB)")
    return out
