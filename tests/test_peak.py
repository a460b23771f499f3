"""The bench report's fp32 GEMM peak (report/peak.py): each runtime times the matmul it claims to
run, the XNNPACK program is checked against torch before it is timed, and an unknown runtime is
refused by name."""

import pytest
import torch

from c2w_export.program.flows import ExecuTorchLoaded
from c2w_export.report.peak import gemm_peak


@pytest.mark.parametrize("runtime", ["torch", "xnnpack"])
def test_gemm_peak_reports_the_matmul_it_timed(runtime):
    """Every size is timed, and the peak is the best of them, with the time of that size's call."""
    p = gemm_peak(runtime, sizes=(32, 64), rounds=1)
    assert p["runtime"] == runtime and sorted(p["by_size"]) == [32, 64]
    assert all(g > 0 for g in p["by_size"].values())
    assert p["gflop_s"] == max(p["by_size"].values()) and p["by_size"][p["n"]] == p["gflop_s"]
    assert p["gflop_s"] == pytest.approx(2 * p["n"] ** 3 / (p["ms"] / 1e3) / 1e9)


def test_gemm_peak_refuses_a_wrong_xnnpack_program(monkeypatch):
    """A program that returns something else than the matmul (here: zeros) is not timed."""
    monkeypatch.setattr(ExecuTorchLoaded, "run", lambda self, method, inputs: (torch.zeros_like(inputs[0]),))
    with pytest.raises(RuntimeError, match="the XNNPACK peak program is wrong"):
        gemm_peak("xnnpack", sizes=(64,), rounds=1)


def test_gemm_peak_names_an_unknown_runtime():
    with pytest.raises(ValueError, match=r"unknown runtime 'cuda'; have 'torch', 'xnnpack'"):
        gemm_peak("cuda", sizes=(8,), rounds=1)
