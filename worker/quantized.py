"""Which of a model's weights the worker serves quantized (docs/design/cpu-paths.md,
"Quantized weights"):

- a GGUF file is served from the file itself (the default): its tensors of a type the
  kernel multiplies by (worker.linear.quant.TYPES) on their blocks as stored, the other
  block types re-quantized to Q8_0, float tensors read as float32 (worker/gguf_quant.py,
  worker/gguf_tensors.py), the model built around them (worker/skeleton.py);
  `--dequantize` serves it as the converted checkpoint's float weights of `--dtype`
  (worker/gguf_convert.py);
- `--quantize q8_0|q4_0` quantizes a float checkpoint's linear layers at load (the output
  head stays float: it is the embedding's own weight in the models that tie them).

The kernel multiplies float32 activations on the CPU in one worker process. A GGUF file
served elsewhere (`--dtype bfloat16`, cuda, `--tp` > 1), or of an architecture whose
layout the worker does not read (phi3, gemma2, starcoder2, gpt2), is converted and served
as float weights, said in one line where the file is quantized; `--quantize` on the former is refused, as it is on a file already quantized.
"""
from __future__ import annotations

import sys

QUANTIZE = ("q8_0", "q4_0")
# --prefill-bf16: a quantized layer's eager calls of this many rows or more multiply in
# bfloat16 (fewer rows read their weights from memory whatever the arithmetic: float32's
# tiles are as fast there; docs/design/cpu-paths.md, "Prompts in bfloat16")
PREFILL_BF16_ROWS = 16
FLOAT = frozenset({"F32", "F16", "BF16"})


def quantized_types(checkpoint: dict) -> list[str]:
    """The block-quantized tensor types of a GGUF checkpoint (none for any other)."""
    return sorted(set(checkpoint.get("tensor_types") or {}) - FLOAT)


def refusal(checkpoint: dict, quantize: str | None, dequantize: bool, device: str,
            dtype: str, tp: int) -> str | None:
    """Why these weight settings cannot start, or None."""
    if quantize is None:
        return None
    if quantize not in QUANTIZE:
        return f"--quantize takes {' or '.join(QUANTIZE)}, not {quantize!r}"
    if dequantize:
        return "--quantize and --dequantize ask for opposite things: pass one"
    if types := quantized_types(checkpoint):
        return (f"--quantize {quantize}: {checkpoint.get('path')} is already quantized "
                f"({', '.join(types)}); it is served on its own blocks without --quantize")
    if (device, dtype, tp) != ("cpu", "float32", 1):
        return ("--quantize runs on the CPU with --dtype float32 and --tp 1 (the quantized "
                f"kernel's activations are float32), not {device}, {dtype}, tp {tp}")
    return None


def mode(checkpoint: dict, quantize: str | None = None, dequantize: bool = False,
         device: str = "cpu", dtype: str = "float32", tp: int = 1) -> str:
    """How the weights are served: "gguf" (a GGUF file's tensors read from the file, its
    blocks as stored: worker/load.py), "q8_0" or "q4_0" (`--quantize`, at load) or "none"
    (the checkpoint's float weights). ValueError for settings it refuses; a quantized file
    served as float weights says why in one line."""
    if why := refusal(checkpoint, quantize, dequantize, device, dtype, tp):
        raise ValueError(why)
    if quantize is not None:
        return quantize
    if dequantize or checkpoint.get("format") != "gguf":
        return "none"
    from worker.gguf_names import ARCHITECTURES
    if why := _why_float(checkpoint, device, dtype, tp, ARCHITECTURES):
        if quantized_types(checkpoint):
            print(f"[worker] {checkpoint.get('path')}: its quantized weights are served as "
                  f"{dtype}: {why}", file=sys.stderr, flush=True)
        return "none"
    return "gguf"


def quantize_float(model, mode: str) -> dict[str, str]:
    """`--quantize`'s layers put in a float model ({module name: type}; none for "none");
    the float weights they replace go back to the system when the load ends (worker/load.py)."""
    if mode not in QUANTIZE:
        return {}
    from worker.linear.quant import TYPES
    from worker.linear.quant_module import quantize_linears
    qtype = TYPES[mode.upper()]
    return {n: qtype.name for n in quantize_linears(model, qtype)}


def _why_float(checkpoint: dict, device, dtype, tp, architectures) -> str | None:
    if (device, dtype, tp) != ("cpu", "float32", 1):
        return ("the quantized kernel runs on the CPU in float32 with --tp 1; here "
                f"{device}, tp {tp}")
    if checkpoint.get("architecture") not in architectures:
        return (f"blocks are read for {', '.join(sorted(architectures))} layouts, not "
                f"{checkpoint.get('architecture')!r}")
    return None


def quantized_flags_problem(a) -> str | None:
    """Why --prefill-bf16 / --int8-activations cannot run with these flags, or None (the
    quantized kernel runs with --tp 1; under --tp the weights are float)."""
    flags = [f for f, on in (("--prefill-bf16", a.prefill_bf16),
                             ("--int8-activations", a.int8_activations)) if on]
    if flags and a.tp != 1:
        return f"{' and '.join(flags)} multiply quantized weights, which run with --tp 1"
    return None


def check_prefill_bf16(mode: str, batch_invariant: bool | None) -> None:
    """ValueError where `--prefill-bf16` cannot run. It runs with batch invariance off (a
    row's logits then depend on how many rows its step's calls hold)."""
    if mode == "none":
        raise ValueError("--prefill-bf16 multiplies quantized weights, and these are float "
                         "(a float checkpoint without --quantize, or --dequantize)")
    if batch_invariant:
        raise ValueError("--prefill-bf16 and --batch-invariant: in bfloat16 a row's logits "
                         "depend on its batch; pass one")
    from worker.linear.quant import has_bf16
    if not has_bf16():
        raise ValueError("--prefill-bf16 needs a CPU with AVX512_BF16 (and the quantized "
                         "kernel built): this one has not")


def quant_layers(model, flag: str) -> list:
    """The QuantLinear layers of `model`; ValueError naming `flag` where it has none."""
    from worker.linear.quant_module import QuantLinear
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if not layers:
        raise ValueError(f"{flag} multiplies quantized weights, and this model has none (a "
                         "float GGUF file)")
    return layers


def wide_bf16(model) -> dict:
    """Every quantized layer of `model` multiplies calls of PREFILL_BF16_ROWS rows or more in
    bfloat16; what the step log records of it. ValueError for a model with none."""
    for layer in quant_layers(model, "--prefill-bf16"):
        layer.bf16_rows = PREFILL_BF16_ROWS
    return {"dtype": "bfloat16", "rows": PREFILL_BF16_ROWS}


def check_int8(mode: str) -> None:
    """ValueError where `--int8-activations` cannot run."""
    if mode == "none":
        raise ValueError("--int8-activations multiplies quantized weights, and these are float "
                         "(a float checkpoint without --quantize, or --dequantize)")
    from worker.linear.quant import has_int8
    if not has_int8():
        raise ValueError("--int8-activations needs a CPU with AVX2 (and the quantized kernel "
                         "built): this one has not")


def int8_activations(model) -> dict:
    """Every quantized layer of `model` rounds its input to int8 (docs/design/cpu-paths.md,
    "Activations in int8"); what the step log records of it: the types it takes (a layer of
    another type, or of rows not whole groups, multiplies in float32). ValueError for a
    model with no quantized layer, or none the path takes."""
    from worker.linear import quant
    layers = quant_layers(model, "--int8-activations")
    # the kernel says which layers it takes: the group x is rounded in, 0 for the others
    groups = {m.qweight.qtype.name: g for m in layers
              if (g := quant.int8_group(m.qweight.qtype, m.in_features))}
    if not groups:   # the flag would change nothing: say so rather than run as if it had
        takes = quant.int8_types()
        raise ValueError(f"--int8-activations: no quantized layer here is one it multiplies "
                         f"({', '.join(takes)} with rows of a multiple of "
                         f"{max(takes.values(), default=0)})")
    for layer in layers:   # only once it is known to apply: a refused model is left as it was
        layer.int8 = True
    return {"dtype": "int8", "group": max(groups.values()), "types": sorted(groups)}


def settings(info: dict) -> dict:
    """make_runner's keywords that re-create a logged worker's weights (replay); ValueError
    for a log whose bfloat16 or int8 mode this worker's differs from (their bits would)."""
    quantization = info.get("quantization") or {}
    mode = quantization.get("mode")
    wide = {}
    if prefill := quantization.get("prefill"):
        if prefill.get("rows") != PREFILL_BF16_ROWS:
            raise ValueError(f"the log multiplied calls of {prefill.get('rows')} rows or more "
                             f"in bfloat16, this worker {PREFILL_BF16_ROWS}")
        wide["prefill_bf16"] = True
    if activations := quantization.get("activations"):
        from worker.linear import quant
        logged, types = activations.get("group"), activations.get("types") or ()
        here = {t: quant.int8_group(quant.TYPES[t]) if t in quant.TYPES else 0 for t in types}
        if not here or any(g != logged for g in here.values()):
            raise ValueError(f"the log rounded activations to int8 in groups of {logged} for "
                             f"{', '.join(types) or 'no type'}, this worker "
                             + (", ".join(f"{t} {g or 'not at all'}" for t, g in here.items())
                                or "for no type"))
        wide["int8_activations"] = True
    if mode in QUANTIZE:
        return {"quantize": mode, **wide}
    if mode == "gguf":
        return wide
    return {"dequantize": True}   # "none", or a log from before quantized weights
