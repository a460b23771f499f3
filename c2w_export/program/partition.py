"""XNNPACK partitions capped by their share of the weights, so loading a program needs less memory.

Without a weight cache (the pip build has none), XNNPACK keeps every source weight of a partition
mapped until it has packed the whole partition, then frees them (XNNCompiler.cpp). Loading a method
therefore peaks at the weights packed so far plus the partition being packed: one partition holding
70% of a real-size program's weights made the load peak 1.68x the file, while running needs 1.32x.
A partition holding more than `MAX_PARTITION_SHARE` of its method's delegated weight bytes is cut
into ceil(its share / MAX_PARTITION_SHARE) consecutive runs of ops, in graph order, with the
heaviest run as light as the ops allow (one op's weight is never split, so a run can stay a little
over the share: 0.53 on tiny). Ops in graph order are topologically sorted, so no run depends on a
later one and the cut makes no cycle. A run starts only where plain float values cross
(`groups_between_cuts`): never through a quantized op's q/dq pattern. Measured at real size
(stateful chunk 25, AMD EPYC, probe before this module): load peak 1.68 -> 1.39x the file, running peak 1.33x either way, chunk-1 and
chunk-25 calls equal within noise, 3 partitions instead of 2.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

# No partition holds more than this share of its method's delegated weight bytes (see above).
MAX_PARTITION_SHARE = 0.5


def pieces(part_bytes: int, total_bytes: int, share: float = MAX_PARTITION_SHARE) -> int:
    """How many runs a partition of `part_bytes` weight bytes is cut into, out of `total_bytes`."""
    if not total_bytes or part_bytes <= share * total_bytes:
        return 1
    return math.ceil(part_bytes / (share * total_bytes) - 1e-9)


def cut(weights: Sequence[int], k: int) -> list[int]:
    """Run index of each op, for ops (in graph order) carrying `weights` bytes, cut into at most `k`
    consecutive runs with the heaviest run as light as it can be (the least capacity a greedy fill
    fits into `k` runs, found by bisection). One op's weight is never split. [n] -> [n]."""
    def fill(cap):
        runs, run, acc = [], 0, 0
        for w in weights:
            if acc and acc + w > cap:
                run, acc = run + 1, 0
            runs.append(run)
            acc += w
        return runs

    lo, hi = max(weights, default=0), sum(weights)
    while lo < hi:
        mid = (lo + hi) // 2
        if (fill(mid)[-1] if weights else 0) < k:
            hi = mid
        else:
            lo = mid + 1
    return fill(lo)


def weight_bytes(node: torch.fx.Node) -> int:
    val = node.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _quant(n: torch.fx.Node) -> bool:
    return "quantize" in str(n.target)  # quantize_per_tensor, dequantize_per_channel, ...


def _plain_float(n: torch.fx.Node) -> bool:
    """A value a run may hand to the next: float32 or float16 (a mixed-precision program, its casts
    delegated: program/casts.py), from no quantize/dequantize, into none."""
    val = n.meta.get("val")
    return (isinstance(val, torch.Tensor) and val.dtype in (torch.float32, torch.float16) and not _quant(n)
            and not any(_quant(u) for u in n.users))


def groups_between_cuts(ops: Sequence[torch.fx.Node]) -> list[int]:
    """Group index of each op (in graph order): a new group, where a run may start, begins only where
    every value crossing from earlier ops to later ones is plain float (`_plain_float`). A cut
    through a quantized op's q/dq pattern, or an int8 value between delegates, makes a program
    XNNPACK cannot load (measured: the real-size int8 program failed to load, 0x1). [n] -> [n]."""
    index = {n: i for i, n in enumerate(ops)}
    last_use = [max((index[u] for u in n.users if u in index), default=i) for i, n in enumerate(ops)]
    ending: dict[int, int] = {}  # op index -> how many blocking values are last used there
    blocking, groups, g = 0, [], 0
    for i, n in enumerate(ops):
        if i and blocking == 0:
            g += 1
        groups.append(g)
        blocking -= ending.pop(i, 0)
        if last_use[i] > i and not _plain_float(n):
            blocking += 1
            ending[last_use[i]] = ending.get(last_use[i], 0) + 1
    return groups


def split_partitions(ep, partitions, share: float = MAX_PARTITION_SHARE) -> list:
    """XNNPACK's partitions of `ep` -> the same nodes, each partition over `share` of the delegated
    weight bytes cut by `cut` between the groups of `groups_between_cuts`. A constant, and an op computing from constants alone (a weight's
    dequantize), goes with the run of its first user, so each run keeps its weights static."""
    from executorch.exir.backend.canonical_partitioners.config_partitioner import is_constant_data
    from torch.fx.passes.infra.partitioner import Partition

    order = {n: i for i, n in enumerate(ep.graph_module.graph.nodes)}
    consts = [{n for n in p.nodes if is_constant_data(ep, n)} for p in partitions]
    total = sum(weight_bytes(n) for c in consts for n in c)
    out: list = []
    for p, const in zip(partitions, consts):
        nodes = sorted(p.nodes, key=order.get)
        fixed = set(const)  # constants and what computes from them alone, inside this partition
        for n in nodes:
            if n.all_input_nodes and all(a in fixed for a in n.all_input_nodes):
                fixed.add(n)
        ops = [n for n in nodes if n not in fixed]

        def leaves(n, seen):  # the constants an op reads, through what computes from them alone
            for a in n.all_input_nodes:
                if a in fixed and a not in seen:
                    seen.add(a)
                    leaves(a, seen)
            return seen

        read = [leaves(n, set()) & const for n in ops]
        claimed: set = set()
        weights = []
        for r in read:  # a constant shared by two ops counts once, for the first
            weights.append(sum(weight_bytes(a) for a in r - claimed))
            claimed |= r
        k = pieces(sum(weight_bytes(n) for n in const), total, share)
        groups = groups_between_cuts(ops)  # ops no run may start between
        group_weights = [0] * (groups[-1] + 1 if groups else 0)
        for g, w in zip(groups, weights):
            group_weights[g] += w
        runs = cut(group_weights, k)
        run_of = {n: runs[g] for n, g in zip(ops, groups)}
        for n in reversed(nodes):  # the fixed nodes: the earliest run among their users here
            if n in fixed:
                users = [run_of[u] for u in n.users if u in run_of]
                run_of[n] = min(users) if users else 0
        for r in sorted(set(run_of.values())):
            out.append(Partition(id=len(out), nodes=dict.fromkeys(n for n in nodes if run_of[n] == r)))
    return out


def capped_xnnpack_partitioner(share: float = MAX_PARTITION_SHARE, **kwargs):
    """An XnnpackPartitioner (same configs, `kwargs` as its own) whose partitions are cut by
    `split_partitions`."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class CappedXnnpackPartitioner(XnnpackPartitioner):
        def generate_partitions(self, ep):
            return split_partitions(ep, super().generate_partitions(ep), share)

    return CappedXnnpackPartitioner(**kwargs)
