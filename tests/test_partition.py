"""XNNPACK partitions capped by weight share (program/partition.py): the cut is the best one, checked
against every possible cut; and a lowered tiny program has no partition holding most of the
delegated weights, measured on ExecuTorch's own lowered modules, while the plain XNNPACK
partitioner leaves one holding 84% of them."""

import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

from c2w_export.program import lowering
from c2w_export.program.partition import MAX_PARTITION_SHARE, cut, pieces
from c2w_export.program.prepare import prepare
from c2w_export.program.variants import example_inputs, export_variant, make_variant
from helpers import cases

# The heaviest delegate of the tiny stateful program may hold this share of the delegated weights.
# The cap is MAX_PARTITION_SHARE (0.5); one conv's weight decides where the cut can fall, and the
# best cut of the tiny dynamic program's one partition leaves 0.553 (measured; 0.534 for the static
# programs). Without the cap: 1.0, one partition.
TINY_HEAVIEST_SHARE = 0.56


def _best_heaviest(weights, k):
    """The lightest possible heaviest run over every way to cut `weights` into at most k runs."""
    n, best = len(weights), sum(weights)
    for r in range(min(k, n)):
        for bounds in itertools.combinations(range(1, n), r):
            edges = (0, *bounds, n)
            best = min(best, max(sum(weights[a:b]) for a, b in zip(edges, edges[1:])))
    return best


def _heaviest(weights, runs):
    per = {}
    for w, r in zip(weights, runs):
        per[r] = per.get(r, 0) + w
    return max(per.values(), default=0)


@settings(max_examples=200)
@given(weights=st.lists(st.integers(0, 50), min_size=1, max_size=9), k=st.integers(1, 4))
def test_cut_is_consecutive_and_its_heaviest_run_is_the_lightest_possible(weights, k):
    runs = cut(weights, k)
    assert len(runs) == len(weights) and runs[0] == 0
    assert all(b - a in (0, 1) for a, b in zip(runs, runs[1:])), runs  # consecutive runs, in order
    assert runs[-1] < k
    assert _heaviest(weights, runs) == _best_heaviest(weights, k), (weights, k, runs)


CUTS = [  # (id, weights, k, runs)
    ("even", [1, 1, 1, 1, 1, 1], 3, [0, 0, 1, 1, 2, 2]),
    ("one-heavy-op-stays-whole", [1, 1, 10, 1, 1], 2, [0, 0, 0, 1, 1]),
    ("weightless-ops-join-a-run", [0, 4, 0, 0, 4, 0], 2, [0, 0, 0, 0, 1, 1]),
    ("one-run", [3, 2, 1], 1, [0, 0, 0]),
]


@pytest.mark.parametrize("weights,k,runs", cases(CUTS))
def test_cut_cases(weights, k, runs):
    assert cut(weights, k) == runs


PIECES = [  # (id, partition bytes, method's delegated bytes, pieces)
    ("under-the-cap", 50, 100, 1),
    ("all-the-weights", 100, 100, 2),
    ("just-over", 51, 100, 2),
    ("no-weights", 0, 0, 1),
]


@pytest.mark.parametrize("part,total,want", cases(PIECES))
def test_pieces(part, total, want):
    assert pieces(part, total, MAX_PARTITION_SHARE) == want


def delegate_shares(ep) -> list[float]:
    """Each XNNPACK delegate's share of the delegated weight bytes, read from ExecuTorch's lowered
    modules (each keeps the partition's ExportedProgram as original_module)."""
    sizes = [lowering.program_bytes(getattr(ep.graph_module, n.target).original_module)
             for n in ep.graph.nodes if n.op == "get_attr" and n.target.startswith("lowered_module")]
    return [s / sum(sizes) for s in sizes]


def _plain_xnnpack():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [XnnpackPartitioner()]


def test_no_delegate_holds_most_of_the_weights(decoder):
    """Loading packs a partition while all its source weights are mapped, so the heaviest partition
    sets the load peak (reports/real/bench.md). The session's own stateful program (the lowering
    cache): delegated whole, one partition cut in two by the cap."""
    m = make_variant(prepare(decoder), "stateful", 25, 72)
    ep = export_variant(m, example_inputs(m))
    shares = delegate_shares(lowering.lower_methods({m.method: ep}, "xnnpack").exported_program(m.method))
    print(f"capped: delegate weight shares {shares}")
    assert max(shares) <= TINY_HEAVIEST_SHARE and len(shares) == 2, shares


class _ConvChain(torch.nn.Module):
    """Four equal convs over a dynamic frame axis: the smallest graph XNNPACK delegates whole."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.convs = torch.nn.Sequential(*(torch.nn.Conv1d(8, 8, 3, padding=1) for _ in range(4)))

    def forward(self, x):
        return self.convs(x)


@pytest.mark.parametrize("capped", [True, False], ids=["capped", "plain-xnnpack-partitioner"])
def test_the_share_check_fails_on_the_plain_partitioner(monkeypatch, capped):
    """The check above on the smallest graph that shows it: the plain partitioner puts every weight in
    one delegate (share 1.0) and fails it; the capped one cuts it in two."""
    if not capped:
        monkeypatch.setitem(lowering.PARTITIONERS, "xnnpack", _plain_xnnpack)
    t = torch.export.Dim("t", min=1, max=25)
    ep = torch.export.export(_ConvChain().eval().requires_grad_(False), (torch.randn(1, 8, 25),), dynamic_shapes=({2: t},))
    shares = delegate_shares(lowering.lower_together({"forward": ep}, "xnnpack").exported_program("forward"))
    assert (max(shares) <= TINY_HEAVIEST_SHARE) == capped, shares
    assert len(shares) == (2 if capped else 1), shares


def quantize_per_tensor(x):  # stand-ins: groups_between_cuts knows q/dq ops by name
    return x


def dequantize_per_tensor(x):
    return x


def _chain(*steps):
    """ops f0(x) -> f1 -> ... in one fx graph; each step (function, dtype of its output)."""
    g, ops = torch.fx.Graph(), []
    prev = g.placeholder("x")
    for fn, dtype in steps:
        prev = g.call_function(fn, (prev,))
        prev.meta["val"] = torch.empty(2, dtype=dtype)
        ops.append(prev)
    g.output(prev)
    return ops


GROUPS = [  # (id, steps, groups): a run may start only where plain float (32 or 16) crosses
    ("float-chain-cuts-anywhere", [(torch.relu, torch.float32)] * 3, [0, 1, 2]),
    ("float16-chain-cuts-anywhere", [(torch.relu, torch.float16)] * 3, [0, 1, 2]),
    ("never-through-q-dq", [(torch.relu, torch.float32), (quantize_per_tensor, torch.int8),
                            (dequantize_per_tensor, torch.float32), (torch.relu, torch.float32),
                            (torch.relu, torch.float32)], [0, 0, 0, 0, 1]),
    ("never-an-int64-value", [(torch.relu, torch.int64), (torch.relu, torch.float32)], [0, 0]),
]


@pytest.mark.parametrize("steps,groups", cases(GROUPS))
def test_runs_start_only_where_plain_float_crosses(steps, groups):
    """A cut through a q/dq pattern made the real-size int8 program fail to load (error 0x1)."""
    from c2w_export.program.partition import groups_between_cuts

    assert groups_between_cuts(_chain(*steps)) == groups


def test_groups_check_catches_a_rule_that_lets_every_value_cross(monkeypatch):
    """With every value taken as plain float, a run could start inside the q/dq pattern, and the
    case above fails."""
    from c2w_export.program import partition

    monkeypatch.setattr(partition, "_plain_float", lambda n: True)
    steps, groups = next(c[1:] for c in GROUPS if c[0] == "never-through-q-dq")
    assert partition.groups_between_cuts(_chain(*steps)) != groups
