"""QuantLinear: an nn.Linear whose weight stays in GGUF blocks (worker/linear/quant.py);
QuantEmbedding: an embedding table in such blocks (the output head's, in the models that
tie them); `quantize_linears`, which puts a QuantLinear in place of each linear layer of a
model that a type can hold (`--quantize`; docs/design/cpu-paths.md, "Quantized weights").
"""
from __future__ import annotations

import torch
from torch import nn

from worker.linear.quant import (BLOCK, BY_ID, QuantType, QuantWeight, blocks_matmul, dequantize,
                                 kernel_code, matmul)
from worker.linear.quantize import quantize


class QuantLinear(nn.Module):
    """y = x W^T + b with W in quantized blocks; float32 in and out. An eager call of at
    least `bf16_rows` rows (0: none) multiplies in bfloat16 (`--prefill-bf16`, quant_bf16.h);
    with `int8`, the other calls round x to int8 (`--int8-activations`, quant_int8.h)."""

    bf16_rows = 0
    int8 = False

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.qweight = weight
        # a buffer, so that the state dict (and the weights' digest, worker/digest.py) holds it
        self.register_buffer("blocks", weight.data)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError(f"a bias of {list(bias.shape)} for {self.out_features} outputs")
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(),
                                                           requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing():   # recorded as one op: worker/graph.py
            return torch.ops.tl.quant_linear(x, self.blocks, self.bias,
                                             kernel_code(self.qweight.qtype.ggml_id, self.int8))
        wide = self.bf16_rows and x.numel() >= self.bf16_rows * self.in_features
        return matmul(x, self.qweight, self.bias, bf16=bool(wide), int8=self.int8)

    def dense(self) -> torch.Tensor:
        """The float32 weight it multiplies by (for references and tests)."""
        return dequantize(self.qweight)

    def extra_repr(self) -> str:
        qtype = "fused" if self.qweight is None else self.qweight.qtype.name   # quant_fuse.py
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={qtype}, bias={self.bias is not None}")


class QuantEmbedding(nn.Module):
    """An embedding table [vocab, dim] in quantized blocks: a lookup decodes the rows it
    takes, to the very float32 weights `dequantize` gives."""

    def __init__(self, weight: QuantWeight):
        super().__init__()
        self.qweight = weight
        self.register_buffer("blocks", weight.data)
        self.num_embeddings, self.embedding_dim = weight.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing():   # recorded as one op: worker/graph.py
            return torch.ops.tl.quant_embedding(ids, self.blocks, self.qweight.qtype.ggml_id,
                                                self.embedding_dim)
        return quant_embedding(ids, self.blocks, self.qweight.qtype.ggml_id, self.embedding_dim)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"qtype={self.qweight.qtype.name}")


def quant_embedding(ids: torch.Tensor, blocks: torch.Tensor, ggml_id: int,
                    dim: int) -> torch.Tensor:
    """The rows `ids` of a quantized table, decoded; tl::quant_embedding's kernel."""
    rows = blocks[ids.reshape(-1)]
    flat = dequantize(QuantWeight(rows, BY_ID[ggml_id], (rows.shape[0], dim)))
    return flat.view(*ids.shape, dim)


def quant_linear(x: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None,
                 ggml_id: int) -> torch.Tensor:
    """tl::quant_linear's kernel (worker/graph.py); `ggml_id` may carry the int8 flag
    (kernel_code)."""
    return blocks_matmul(x, blocks, ggml_id, bias)


def quantizable(mod: nn.Module) -> bool:
    """A float linear layer whose input size is whole blocks."""
    return (type(mod) is nn.Linear and mod.in_features % BLOCK == 0
            and mod.weight.dtype.is_floating_point)


def quantize_linears(model: nn.Module, qtype: QuantType,
                     skip: tuple[str, ...] = ("lm_head",)) -> list[str]:
    """Replace every quantizable nn.Linear of `model` (but the names ending in `skip`: the
    output head shares the embedding's weight in tied models) by a QuantLinear of `qtype`.
    The names replaced, in order."""
    done = []
    for name, mod in list(model.named_modules()):
        if not quantizable(mod) or name.endswith(skip):
            continue
        put(model, name, QuantLinear(quantize(mod.weight.data, qtype), mod.bias))
        done.append(name)
    return done


def put(model: nn.Module, name: str, layer: nn.Module) -> None:
    """Set the submodule `name` ("model.layers.0.mlp.up_proj") of `model` to `layer`."""
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, layer)
