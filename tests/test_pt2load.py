"""The memoised `.pt2` load (program/pt2load.py) gives the program torch's own load gives."""

import pytest
import torch

from c2w_export.program import pt2load
from helpers import cases


def _described(ep) -> tuple:
    """What a loaded program is: its code, symbolic sizes and their ranges, every node's value, its signature."""
    return (ep.graph_module.code, str(ep.range_constraints), str(ep.graph_signature),
            [(n.name, str(n.meta.get("val"))) for n in ep.graph.nodes])


MEMOS = cases([
    ("as-shipped", None),
    # a deliberate bug: every expression string of one length parses as the first of that length
    ("expressions-keyed-by-length", len),
])


@pytest.fixture(scope="module")
def torch_loaded(artifacts) -> dict:
    """{.pt2 path: torch's own load of it, described}: loaded once for this module's cases."""
    return {path: _described(torch.export.load(str(path))) for path in sorted(artifacts.glob("*.pt2"))}


@pytest.mark.parametrize("key", MEMOS)
def test_the_memoised_load_is_torchs_load(torch_loaded, monkeypatch, key):
    """Both variants' .pt2 (the session's torch_export artifacts: dynamic chunk, symbolic sizes in
    every node), loaded by torch and by pt2load: the same program. With the memo keyed wrongly, the
    comparison sees it."""
    if key is not None:
        monkeypatch.setattr(pt2load, "_expression_key", key)
    assert len(torch_loaded) == 2
    for path, theirs in torch_loaded.items():
        try:
            memo = _described(pt2load.load(path))
        except Exception as e:  # noqa: BLE001 -- a wrong parse may also fail to load at all
            memo = f"{type(e).__name__}: {e}"
        assert (memo == theirs) == (key is None), path.name
