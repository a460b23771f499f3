"""The bench report's fp32 GEMM peak (report/peak.py): each runtime times the matmul it claims to
run, the XNNPACK program is checked against torch before it is timed, and an unknown runtime is
refused by name."""

import pytest
import torch

from c2w_export.program.flows import ExecuTorchLoaded
from c2w_export.report.peak import gemm_peak


@pytest.mark.parametrize("runtime", ["torch", "xnnpack"])
def test_gemm_peak_reports_the_matmul_it_timed(runtime):
    p = gemm_peak(runtime, n=64, rounds=1)
    assert p["runtime"] == runtime and p["n"] == 64
    assert p["gflop_s"] > 0 and p["gflop_s"] == pytest.approx(2 * 64 ** 3 / (p["median_ms"] / 1e3) / 1e9)


def test_gemm_peak_refuses_a_wrong_xnnpack_program(monkeypatch):
    """A program that returns something else than the matmul (here: zeros) is not timed."""
    monkeypatch.setattr(ExecuTorchLoaded, "run", lambda self, method, inputs: (torch.zeros_like(inputs[0]),))
    with pytest.raises(RuntimeError, match="the XNNPACK peak program is wrong"):
        gemm_peak("xnnpack", n=64, rounds=1)


def test_gemm_peak_names_an_unknown_runtime():
    with pytest.raises(ValueError, match=r"unknown runtime 'cuda'; have 'torch', 'xnnpack'"):
        gemm_peak("cuda", n=8, rounds=1)
