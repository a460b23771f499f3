"""float16 conv weights stored as float16 in an XNNPACK `.pte`, not as float32.

ExecuTorch's XNNPACK serializer writes every conv's filter and bias as float32, whatever their dtype
(`op_conv2d.py`: `define_tensor(..., force_fp32=True)`). It dates from an XNNPACK that took only a
float32 filter for a float16 conv; ExecuTorch PR #9753 stopped forcing linears' weights and kept the
convs'. XNNPACK then converts that float32 filter back to float16 when it packs it
(`XNN_FLAG_FP32_STATIC_WEIGHTS`, `xnn_pack_f32_to_f16_*`). So a float16 program's conv weights
took twice their bytes in the file, and the fp16 `.pte` was 0.76x the fp32 one, not ~0.5x.

The XNNPACK that ExecuTorch 1.5.1 builds takes a float16 filter and bias for a float16 conv and
depthwise conv (`convolution-2d.c`, `depthwise-convolution-2d.c`), not for a transposed conv with
float16 I/O (`deconvolution-2d.c`); `prepare` writes the decoder's transposed convs as convs of their
output phases, and a transposed conv keeps ExecuTorch's float32 here anyway.

float16 -> float32 -> float16 is exact, so XNNPACK packs the same float16 values either way: the
outputs are the same, bit for bit (tests/test_lowering.py).
"""

from __future__ import annotations

import functools

import torch

CONV = "aten.convolution.default"


def register() -> None:
    """Replace ExecuTorch's conv visitor with HalfWeightConv in its XNNPACK serializer (once per
    process: lowering workers call it too)."""
    from executorch.backends.xnnpack.operators import node_visitor

    Conv2d = stock()
    if node_visitor._node_visitor_dict[CONV] is not Conv2d:
        return

    class HalfWeightConv(Conv2d):
        """ExecuTorch's conv visitor; a float16 conv's filter and bias kept float16 (not transposed)."""

        def define_node(self, node, *args, **kwargs) -> None:
            self._keep_half = node.meta["val"].dtype == torch.float16 and not node.args[6]  # args[6]: transposed
            super().define_node(node, *args, **kwargs)

        def define_tensor(self, *args, force_fp32: bool = False, **kwargs) -> None:
            # force_fp32 only casts float16 and bfloat16 values (node_visitor.get_serialized_buffer_index)
            super().define_tensor(*args, force_fp32=force_fp32 and not self._keep_half, **kwargs)

    node_visitor.register_node_visitor(HalfWeightConv)


@functools.cache
def stock() -> type:
    """ExecuTorch's own conv visitor class, as its registry held it before register() (its module's
    name is None: ExecuTorch's decorator returns nothing)."""
    import executorch.backends.xnnpack.operators  # noqa: F401  (ExecuTorch's own visitors registered)
    from executorch.backends.xnnpack.operators import node_visitor

    return node_visitor._node_visitor_dict[CONV]
