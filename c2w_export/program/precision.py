"""Precision as data: what a reduced-precision program is compared with, and how it is made.

A `Precision` other than fp32 adds one stage to a flow (`with_precision`). That stage's artifact is
the program's *own reference*: the decoder at that precision, run eagerly by PyTorch. A build then
holds each program to two gates (tolerances.py keys them by the precision's key):

1. the stages after it, and the loaded program, against the own reference at the flow's gate for
   that dtype (`tolerance(flow, dtype)`): catches exporter and runtime bugs;
2. the loaded program against the fp32 eager decoder at the quality floor
   (`tolerance("quality", key)`): the quality budget, which a broken or badly chosen precision
   transform fails even when the program matches its own reference.

    fp16   after prepare: the prepared decoder in float16 (weights and activations); the programs
           keep the float32 contract (variants.io_dtype), RoPE's inverse frequencies stay float32.
    int8*  after export: static PT2E quantization for XNNPACK (int8 activations, per-channel int8
           weights) of the ops of its `parts` (QUANT_PARTS), calibrated on seeded code streams
           (CALIBRATION, recorded in the manifest). The position math stays int64 and out of it;
           the state stays float32 (a quantized conv's input is the concatenation of the float
           state and the chunk, quantized after the concatenation).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..model.decoder import Code2Wav
from .flows import FLOWS, Flow, FlowError, ModuleLoaded, Pt2Loaded, Stage, Work
from .variants import export_variant, make_variant, parity_inputs


def to_half(decoder: Code2Wav, fp32: tuple[str, ...] = (), upcast: bool = True) -> Code2Wav:
    """A float16 copy of `decoder`. Buffers a module names in KEEP_FP32 stay float32 (RoPE's
    positions * inv_freq: float16 holds integers exactly only up to 2048).

    `fp32`: module paths of `decoder` whose subtrees keep their float32 weights (a mixed precision:
    the decoder casts at their edges, layers.into). `upcast=False`: the float16 parts' norms and
    softmax compute in float16 too (layers.work_dtype), so the float16 transformer has no cast
    inside, which XNNPACK would not delegate."""
    modules = dict(decoder.named_modules())
    for path in fp32:
        if path not in modules:
            raise FlowError(f"no module {path!r} in the decoder to keep in float32")
    half = copy.deepcopy(decoder)
    for name, module in half.named_modules():
        if not any(name == p or name.startswith(p + ".") for p in fp32):
            module._apply(lambda t: t.half() if t.is_floating_point() else t, recurse=False)
            if hasattr(module, "upcast"):
                module.upcast = upcast
    for src, dst in zip(decoder.modules(), half.modules()):
        for name in getattr(src, "KEEP_FP32", ()):
            dst._buffers[name] = src._buffers[name].detach().clone().float()
    return half.eval().requires_grad_(False)


@dataclass(frozen=True)
class Half(Stage):
    """{method: prepared fp32 variant} -> the same variants over one float16 copy per decoder
    (to_half with `fp32` and `upcast`)."""

    fp32: tuple[str, ...] = ()
    upcast: bool = True
    name: str = "half"
    compared: bool = True
    own_reference: bool = True

    def run(self, modules, work: Work):
        halves: dict[int, Code2Wav] = {}  # one float16 copy per decoder
        for v in modules.values():
            if id(v.decoder) not in halves:
                halves[id(v.decoder)] = to_half(v.decoder, self.fp32, self.upcast)
        return {m: make_variant(halves[id(v.decoder)], v.variant, v.max_chunk, v.context) for m, v in modules.items()}

    def program(self, modules):
        return ModuleLoaded(modules)

    def references(self, modules, work: Work) -> dict:
        return dict(modules)


# ---------------------------------------------------------------- int8
# part name -> (what it covers, the aten ops quantized, module-path prefixes (None: everywhere))
QUANT_PARTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...] | None]] = {
    "convs": ("every conv1d and transposed conv1d", ("conv1d", "conv_transpose1d"), None),
    "linears": ("every linear (transformer projections and MLPs, ConvNeXt pointwise convs)", ("linear",), None),
    "tail": ("the last decoder block and the final conv", ("conv1d", "conv_transpose1d"),
             ("decoder.decoder.4.", "decoder.decoder.6.")),
    "transformer-layers": ("the transformer layers' linears (attention projections and MLPs)", ("linear",),
                           ("decoder.pre_transformer.layers.",)),
    "convnext": ("the ConvNeXt blocks' pointwise linears", ("linear",), ("decoder.upsample.",)),
}
# prepare's modules that move values exactly (a +-1 permutation as a linear): never quantized
EXACT_MODULES = ("Rotate", "ShiftTrim", "LastFrames")
CALIBRATION = {"calls": 12, "seed": 777}  # seeded calibration: per method, `calls` parity_inputs at `seed`


@dataclass(frozen=True)
class OwnModule:
    """A quantized method's own reference: the converted PT2E graph (q/dq ops around fp32 math, run by
    PyTorch), callable like the variant module it came from."""

    module: Callable
    initial_state: Callable[[], tuple]

    def __call__(self, *inputs):
        out = self.module(*inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else out


def _quantizer(parts: tuple[str, ...], dynamic: bool = False):
    """XNNPACK's quantizer, annotating only the ops of `parts` (op types, never its global config:
    that also annotates every cat, the int64 position cat included). `dynamic`: activations quantized
    per call (XNNPACK's qd8), weights per output channel, as static. XNNPACK's quantizer annotates a
    dynamic conv only when it is a standard 2-D one (xnnpack_quantizer_utils.py: a 4-D weight, not
    depthwise), so the decoder's Conv1d stay float32 under it."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                         get_symmetric_quantization_config)

    class Quantizer(XNNPACKQuantizer):
        def transform_for_annotation(self, model):
            # XNNPACK's turns every scalar of add/mul into a float32 tensor, so `pos + T` (int64)
            # came back float32. No add or mul is annotated here, so nothing needs it.
            return model

    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    prefixes = tuple(p for part in parts for p in (QUANT_PARTS[part][2] or ("",)))

    def in_parts(n) -> bool:
        if n.op != "call_function":  # weights and biases: judged by the op that uses them
            return True
        stack = (n.meta.get("nn_module_stack") or {}).values()
        if any(str(getattr(t, "__name__", t)).rpartition(".")[2] in EXACT_MODULES for _, t in stack):
            return False
        return any(path.startswith(p) for path, _ in stack for p in prefixes)

    q = Quantizer()
    for op in sorted({op for part in parts for op in QUANT_PARTS[part][1]}):
        q.set_operator_type(getattr(torch.ops.aten, op).default, config)
    q.set_filter_function(in_parts)
    return q


def quantize(graph: nn.Module, module: nn.Module, parts: tuple[str, ...], calls: int = CALIBRATION["calls"],
             seed: int = CALIBRATION["seed"], calibrate: bool = True, dynamic: bool = False):
    """PT2E static int8 of `graph` (the exported graph of the prepared fp32 variant `module`):
    annotate `parts`, run `calls` seeded calls (stateful: one stream, state fed back), convert.
    -> the converted GraphModule (the own reference). `calibrate=False` skips the calls (a broken
    quantization, which the gate must reject). `dynamic`: qd8 (activations quantized per call; the
    calls set the weights' observers only), each quantize chain of an input shared by several linears
    duplicated so that each linear has its own (ExecuTorch's DuplicateDynamicQuantChainPass, which
    its XNNPACK partitioner needs to take each)."""
    from executorch.backends.transforms.duplicate_dynamic_quant_chain import DuplicateDynamicQuantChainPass
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with torch.no_grad():
        observed = prepare_pt2e(graph, _quantizer(parts, dynamic))
        state = module.initial_state()
        for c in (parity_inputs(module, calls, seed) if calibrate else []):
            out = observed(*c, *state)
            state = tuple(out[1:]) if isinstance(out, (tuple, list)) else ()
        converted = convert_pt2e(observed)
        if dynamic:
            DuplicateDynamicQuantChainPass()(converted)
        return converted


@dataclass(frozen=True)
class Quantize(Stage):
    """{method: ExportedProgram} -> the same, PT2E-quantized and re-exported; the converted graphs
    are the own reference."""

    parts: tuple[str, ...] = ()
    calibrate: bool = True
    dynamic: bool = False
    name: str = "quantize"
    compared: bool = True
    own_reference: bool = True

    def run(self, programs, work: Work):
        out = {}
        for m, ep in programs.items():
            converted = quantize(ep.module(check_guards=False), work.modules[m], self.parts, calibrate=self.calibrate,
                                 dynamic=self.dynamic)
            out[m] = export_variant(converted, work.inputs[m], work.modules[m])
        return out

    def program(self, programs):
        return Pt2Loaded(programs)

    def references(self, programs, work: Work) -> dict:
        return {m: OwnModule(ep.module(check_guards=False), work.modules[m].initial_state)
                for m, ep in programs.items()}


@dataclass(frozen=True)
class Precision:
    name: str  # the CLI's --precision and the manifest's record
    key: str  # the tolerance table's key for this precision's gates (fp32: float32, fp16: float16, int8*: its name)
    stage: Callable[[], Stage] | None = None  # makes the own reference; None: the fp32 decoder is the reference
    after: str = ""  # the flow stage it follows
    what: str = ""  # what is reduced, for the manifest and reports
    parts: tuple[str, ...] = ()  # int8: QUANT_PARTS quantized
    dynamic: bool = False  # int8: activations quantized per call (qd8); the calibration calls set only the weights' observers
    half: bool = False  # computes in float16: its XNNPACK side 1 depends on the CPU's fp16 arithmetic, and its
    # quality is also judged with native fp16 arithmetic (native_fp16.py, pipeline.NATIVE)
    fp32: tuple[str, ...] = ()  # half: module paths of the prepared decoder kept float32 (to_half)
    upcast: bool = True  # half: norms and softmax in float32 (to_half)

    def record(self) -> dict:
        """What the manifest records about it."""
        extra = {"parts": {p: QUANT_PARTS[p][0] for p in self.parts}, "calibration": dict(CALIBRATION)} if self.parts else {}
        if self.fp32:
            extra["fp32_modules"] = list(self.fp32)
        return {"name": self.name, "key": self.key, "what": self.what, **extra}

    def arithmetic(self) -> str:
        """The arithmetic this precision's XNNPACK kernels use on this CPU (env.FP16_ARITHMETICS; int8 and
        fp32: their own, the same on every CPU)."""
        from ..env import fp16_arithmetic

        if self.half:
            return fp16_arithmetic()
        return ("int8 dynamic (qd8) kernels" if self.dynamic else "int8 integer kernels") if self.parts else "float32"


# fp16-mixed: the modules kept float32, chosen by measuring each part under native fp16 arithmetic
# (report/sensitivity.py). The conv stack loses the most (long reductions into an fp16 accumulator), so it
# stays float32, bytes and all; what stays float16 holds the transformer's and the codebooks' bytes.
MIXED_FP32 = ("quantizer.rvq_first.output_proj", "quantizer.rvq_rest.output_proj", "pre_conv",
              "pre_transformer.input_proj", "pre_transformer.norm", "pre_transformer.output_proj",
              *(f"upsample.{i}.{m}" for i in (0, 1) for m in ("0", "1.dwconv", "1.norm", "1.pwconv1")), "decoder")


def _int8(name: str, parts: tuple[str, ...], dynamic: bool = False) -> Precision:
    how = "dynamically quantized int8 (PT2E, XNNPACK qd8: activations per call)" if dynamic else "static int8 (PT2E, XNNPACK)"
    return Precision(name, name, lambda: Quantize(parts, dynamic=dynamic), "export",
                     f"{how}: " + "; ".join(QUANT_PARTS[p][0] for p in parts) + "; the rest, the state and the I/O float32",
                     parts, dynamic=dynamic)


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "float32", what="float32 weights and activations"),
    Precision("fp16", "float16", Half, "prepare",
              "float16 weights and activations (RoPE frequencies float32); float32 inputs, outputs and state",
              half=True),
    Precision("fp16-mixed", "float16-mixed", lambda: Half(MIXED_FP32, upcast=False), "prepare",
              "float16 transformer layers (norms and softmax too), ConvNeXt output linears and codebooks; the "
              "convs, the transformer's projections and final norm, the ConvNeXt norms, input linears and GELU "
              "float32 (reports/real/fp16-sensitivity.md); float32 inputs, outputs and state",
              half=True, fp32=MIXED_FP32, upcast=False),
    _int8("int8", ("convs", "linears")),
    _int8("int8-convs", ("convs",)),
    _int8("int8-linears", ("linears",)),
    _int8("int8-tail", ("tail",)),
    # qd8 takes no Conv1d (_quantizer); the transformer's input and output projections stay float32: with them
    # every linear measured 23.1-25.1 dB eager on tiny, without them 41-44 (docs/precision.md)
    _int8("int8-dynamic", ("transformer-layers", "convnext"), dynamic=True),
)}
FP32 = "fp32"


def get_precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise FlowError(f"unknown precision {name!r}; choose from {sorted(PRECISIONS)}")
    return PRECISIONS[name]


def with_precision(flow: Flow, name: str) -> Flow:
    """`flow` with the precision's stage inserted after the stage it follows (fp32: `flow` itself)."""
    p = get_precision(name)
    if p.stage is None:
        return flow
    names = [s.name for s in flow.stages]
    if p.after not in names:
        raise FlowError(f"precision {name} needs a flow with a '{p.after}' stage; {flow.name} has {names} "
                        f"(the eager flow is the fp32 reference)")
    from .tolerances import TOLERANCES

    if (flow.name, p.key) not in TOLERANCES:
        gated = sorted(f for f, d in TOLERANCES if d == p.key and f in FLOWS)
        raise FlowError(f"precision {name} has no measured gate for {flow.name}; it is gated for {gated}")
    i = names.index(p.after) + 1
    return dataclasses.replace(flow, stages=(*flow.stages[:i], p.stage(), *flow.stages[i:]), precision=name)


def own_references(decoder: Code2Wav, name: str, specs) -> dict:
    """{method: the eager module a `name` program is compared with (gate side 1)}, rebuilt from
    the fp32 `decoder` for `specs` ({method: MethodSpec}) as an export builds it (verify)."""
    from .prepare import prepare

    p = get_precision(name)
    if p.stage is None:
        return {m: make_variant(decoder, s.variant, s.max_chunk, s.context) for m, s in specs.items()}
    prepared = prepare(decoder)
    if p.after == "prepare":  # fp16
        half = to_half(prepared, p.fp32, p.upcast)
        return {m: make_variant(half, s.variant, s.max_chunk, s.context) for m, s in specs.items()}
    out = {}
    for m, s in specs.items():  # int8: quantized from the prepared variant, as the Quantize stage does
        module = make_variant(prepared, s.variant, s.max_chunk, s.context)
        example = parity_inputs(module, 1, 0)[0] + module.initial_state()
        graph = export_variant(module, example).module(check_guards=False)
        out[m] = OwnModule(quantize(graph, module, p.parts, dynamic=p.dynamic), module.initial_state)
    return out
