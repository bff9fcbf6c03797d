"""The worker a log was made with, rebuilt for `verify --with-model`: the same model,
block layout, dtype and device as the log's meta says, or a clear refusal.

Bit-exact replay needs the same kernels: a log made on CUDA is re-run on CUDA. Another
device or dtype may be asked for explicitly (--device/--dtype); tokens may then differ
where the top two logits are close, and the verdict says where.

A log made in the batch-invariant mode (model_info.batch_invariant) is re-run in it, and a
log made on quantized weights on the same quantized weights (model_info.quantization,
worker/quantized.py), and one that drafted with a draft model (model_info.draft) with it.

A log made with a tensor-parallel worker (meta's model_info.tp > 1) is re-run in one
process: its logits differ from the TP run's by the all-reduces' rounding (~1e-4 in
float32), so tokens are equal wherever the top two logits are further apart than that.
"""
from __future__ import annotations


class ModelUnavailable(Exception):
    """The log's model, device or dtype cannot be had on this machine."""


def runner_for(meta: dict, device: str | None = None, dtype: str | None = None):
    from worker import quantized
    from worker.load import DTYPES, make_runner
    info = meta["model_info"]
    device = device or info.get("device", "cpu")
    dtype = dtype or info.get("dtype", "float32")
    _check_device(device, info.get("device", "cpu"))
    if dtype not in DTYPES:
        raise ModelUnavailable(f"the log's dtype {dtype!r} is not one this worker runs "
                               f"({', '.join(DTYPES)}); pass --dtype")
    try:
        runner = make_runner(meta["model"], device=device, dtype=dtype,
                             num_blocks=meta["num_blocks"], block_size=meta["block_size"],
                             max_model_len=info["max_model_len"],
                             batch_invariant=info.get("batch_invariant", False),
                             draft=info.get("draft") or None, **quantized.settings(info))
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelUnavailable(f"cannot load the log's model {meta['model']!r}: {e}") from None
    _check_same_file(info.get("checkpoint") or {}, runner.info.checkpoint)
    _check_same_int8(info.get("quantization") or {}, runner.info.quantization or {})
    return runner


def _check_same_int8(logged: dict, loaded: dict) -> None:
    """A log made with --int8-activations is re-run only where this kernel rounds the same
    layers: one that takes a type the log's did not (or not one it did) changes their bits."""
    want, got = logged.get("activations"), loaded.get("activations")
    if want and want != got:
        raise ModelUnavailable(f"the log rounded activations to int8 as {want}; this worker "
                               f"would round them as {got} on this model: its bits would differ")


def _check_same_file(logged: dict, loaded: dict) -> None:
    """A GGUF model is re-run only from the very file the log was made with (its sha256)."""
    want = logged.get("sha256")
    if want is not None and loaded.get("sha256") != want:
        raise ModelUnavailable(f"the log was made with {logged.get('path')} (sha256 {want}); "
                               f"{loaded.get('path')} has sha256 {loaded.get('sha256')}")


def tp_warning(meta: dict) -> str | None:
    """What to say when the log ran tensor-parallel and the re-run does not."""
    tp = meta["model_info"].get("tp", 1)
    if tp == 1:
        return None
    return (f"the log ran with tp {tp}; re-running in one process (tp 1): tokens may differ "
            "where the top two logits are within the TP rounding (~1e-4)")


def _check_device(device: str, logged: str) -> None:
    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelUnavailable(
            f"the log was made on {logged}; this machine has no CUDA device. Pass --device cpu "
            "to re-run on the CPU (tokens may then differ where the top two logits are close)")
    if not device.startswith(("cpu", "cuda")):
        raise ModelUnavailable(f"unknown device {device!r} (cpu or cuda)")
