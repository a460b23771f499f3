"""float32 <-> float16 casts inside the XNNPACK delegate, so a mixed-precision program's parts of
two dtypes stay in one partition.

ExecuTorch's XNNPACK partitioner takes a `_to_dim_order_copy` only when it keeps the dtype
(`ToDimOrderCopyConfig`), and its preprocess treats every `_to_copy` as a copy between memory
formats (`RemoveRedundantCopyPass` drops one between two contiguous tensors: a delegated
float32 -> float16 cast then hands float32 bytes to a float16 op). So every cast at the edge of a
mixed-precision part ran on portable kernels and cut the delegate there. XNNPACK converts between
the two dtypes itself (`xnn_define_convert`), and ExecuTorch's runtime defines an `XNNConvert` node
for any dtype pair XNNPACK takes (`defineConvertNode`, XNNCompiler.cpp); its own lowering emits one
only for quantize and dequantize.

So, at lowering only (a `.pt2` keeps plain casts):
- `to_float_casts`, an edge pass before partitioning, writes each contiguous float32 <-> float16
  cast as `c2w::float_cast`, an op of this package that no XNNPACK pass rewrites;
- `FloatCastConfig` partitions it, and `FloatCastVisitor` serializes it as one `XNNConvert`;
- `back_to_copies`, after partitioning, writes any `c2w::float_cast` left outside the delegate back
  as the `_to_dim_order_copy` it was (the runtime has no kernel for the op of this package).

The conversion rounds to nearest even, as torch's cast does (float16 -> float32 is exact): the
outputs are the same, bit for bit (tests/test_lowering.py).
"""

from __future__ import annotations

import torch

FLOATS = (torch.float32, torch.float16)

_LIB = torch.library.Library("c2w", "DEF")
_LIB.define("float_cast(Tensor x, ScalarType dtype) -> Tensor")


@torch.library.impl(_LIB, "float_cast", "CompositeExplicitAutograd")
def _float_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype)


@torch.library.register_fake("c2w::float_cast")
def _float_cast_fake(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_like(x, dtype=dtype)


def _dim_order_copy():
    from executorch.exir.dialects._ops import ops as exir_ops

    return exir_ops.edge.dim_order_ops._to_dim_order_copy.default


def _edge_float_cast():
    from executorch.exir.dialects._ops import ops as exir_ops

    return exir_ops.edge.c2w.float_cast.default


def is_float_cast(node: torch.fx.Node) -> bool:
    """An edge `_to_dim_order_copy` between float32 and float16 of a contiguous tensor, nothing else."""
    if node.op != "call_function" or node.target != _dim_order_copy() or len(node.all_input_nodes) != 1:
        return False
    src, dst = node.all_input_nodes[0].meta.get("val"), node.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
        return False
    order = node.kwargs.get("dim_order")
    contiguous = order is None or list(order) == list(range(dst.dim()))
    return contiguous and src.dtype != dst.dtype and {src.dtype, dst.dtype} <= set(FLOATS)


def _rewrite(graph: torch.fx.Graph, pick, make) -> int:
    """Give each node `pick` selects `make(node)`'s (target, args, kwargs), in place (its name, which
    the graph signature may hold, and its meta stay)."""
    n = 0
    for node in graph.nodes:
        if pick(node):
            node.target, node.args, node.kwargs = make(node)
            n += 1
    return n


def _pass(name: str, pick, make):
    from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

    class Rewrite(ExportedProgramPassBase):
        def call(self, ep):
            changed = _rewrite(ep.graph, pick, make) > 0
            if changed:
                ep.graph_module.recompile()
            return ExportedProgramPassResult(ep, changed)

    Rewrite.__name__ = name
    return Rewrite()


def to_float_casts():
    """Edge pass (before partitioning): every is_float_cast node as c2w::float_cast."""
    return _pass("ToFloatCasts", is_float_cast,
                 lambda n: (_edge_float_cast(), (n.args[0], n.meta["val"].dtype), {}))


def back_to_copies():
    """Edge pass (after partitioning): every c2w::float_cast outside the delegate as the
    `_to_dim_order_copy` it was."""
    return _pass("BackToCopies", lambda n: n.op == "call_function" and n.target == _edge_float_cast(),
                 lambda n: (_dim_order_copy(), (n.args[0],), {"dtype": n.args[1],
                                                              "dim_order": list(range(n.meta["val"].dim()))}))


def register() -> list:
    """Register FloatCastVisitor with ExecuTorch's XNNPACK serializer (once per process: lowering
    workers call it too) -> [FloatCastConfig], the partitioner config to add to XNNPACK's."""
    import executorch.backends.xnnpack.operators  # noqa: F401  (ExecuTorch's own visitors first)
    from executorch.backends.xnnpack.operators import node_visitor
    from executorch.backends.xnnpack.partition.config.generic_node_configs import GenericNodePartitionerConfig
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import XNNConvert, XNode
    from executorch.backends.xnnpack.utils.utils import get_input_node

    class FloatCastConfig(GenericNodePartitionerConfig):
        target_name = "float_cast.default"

        def supported_precision_types(self):
            return [ConfigPrecisionType.FP32]

    class FloatCastVisitor(node_visitor.NodeVisitor):
        target = "c2w.float_cast.default"

        def define_node(self, node, xnn_graph, vals_to_ids, debug_handle) -> None:
            source = get_input_node(node, 0)
            self.define_tensor(source, xnn_graph, vals_to_ids)
            self.define_tensor(node, xnn_graph, vals_to_ids)
            xnn_graph.xnodes.append(XNode(
                xnode_union=XNNConvert(input_id=vals_to_ids[source], output_id=vals_to_ids[node], flags=0),
                debug_handle=debug_handle))

    if FloatCastVisitor.target not in node_visitor._node_visitor_dict:
        node_visitor.register_node_visitor(FloatCastVisitor)
    return [FloatCastConfig]
