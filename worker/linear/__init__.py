"""The worker's linear layers (docs/design/cpu-paths.md, "Packed linear layers", "Panel linear layers",
"Batch-invariant mode"): dispatch.py decides which kernel multiplies by a weight; packed.py
packs a model's layers (siblings fused) for it; panels.py is the C panel kernel; rows.py
plans the batch-invariant mode's row padding; quant.py multiplies by weights in GGUF's
quantized blocks (quantize.py writes them; docs/design/cpu-paths.md, "Quantized weights").

Imports nothing: replay's step-time model reads ROW_ALIGN without loading torch.
"""

ROW_ALIGN = 4   # invariant-mode calls of a multiple of 4 rows agree row by row, whatever the count
