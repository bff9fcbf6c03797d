"""A ForwardBatch's packed arrays as the tensors one forward pass needs, built once per step."""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch

from core.ipc.protocol import ForwardBatch
from worker.attention import DecodeGroup, NativeDecode, PagedStep, PrefillSpan


@dataclass
class StepInputs:
    input_ids: torch.Tensor    # [1, T] long
    positions: torch.Tensor    # [1, T] long
    keep: torch.Tensor         # [R + P] long: the token index whose logits each sample row
                               # uses, then each prompt-logprob row's (batch.prompt_rows)
    paged: PagedStep


def as_tensor(a: array, dtype: torch.dtype) -> torch.Tensor:
    """A zero-copy view of a packed array (frombuffer refuses empty buffers)."""
    if len(a) == 0:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(a, dtype=dtype)


def _long(a: array) -> torch.Tensor:
    return as_tensor(a, torch.int32).long()


def build_step(batch: ForwardBatch, kv: torch.Tensor, use_native: bool = False,
               windows: tuple[int, ...] = (), per_row: bool = False) -> StepInputs:
    """`use_native`: decodes go to the C kernel (worker/native.py), which the caller checked.
    `windows`: the sliding-window sizes the model's layers ask for (worker/archs.py).
    `per_row` (the batch-invariant mode, docs/design/cpu-paths.md "Batch-invariant mode"): every
    token, prefill tokens included, is a row of the C kernel over its causal context."""
    if (use_native or per_row) and windows:
        raise ValueError("the C decode kernel has no sliding window")
    device = kv.device
    block_size = kv.shape[3]
    qs = _long(batch.query_start)
    ctx = _long(batch.context_lens)
    slots = _long(batch.slot_mapping)
    if len(slots) and int(slots.max()) >= kv.shape[2] * block_size:
        raise ValueError("slot_mapping points past the KV pool")
    tables = _long(batch.block_tables).view(batch.num_seqs, batch.table_width)
    _check_tables(tables, ctx, kv.shape[2], block_size)
    qlen = qs[1:] - qs[:-1]
    if per_row:
        return _per_row(batch, kv, slots, tables, ctx, qlen, qs)
    multi = (qlen != 1).nonzero()  # the leading one-token sequences take the decode path
    nd = int(multi[0, 0]) if len(multi) else batch.num_seqs

    fast = nd > 0 and use_native

    def masks(window: int | None = None):
        groups = [] if fast else decode_groups(ctx[:nd], tables[:nd], block_size, device, window)
        spans = [_span(int(qs[i]), int(qs[i + 1]), int(ctx[i]), tables[i], block_size, device,
                       window) for i in range(nd, batch.num_seqs)]
        return groups, spans

    groups, spans = masks()
    longest = int(ctx.max()) if len(ctx) else 0
    # a window at least as long as every context in the step cuts nothing
    cut = {w: masks(w) if longest > w else (groups, spans) for w in windows}
    keep = _keep(batch, qs)
    paged = PagedStep(kv=kv, slot_mapping=slots.to(device), num_decode=nd,
                      decode_groups=groups, spans=spans,
                      native=NativeDecode(tables[:nd].contiguous(), ctx[:nd].contiguous())
                      if fast else None, windows=cut)
    return StepInputs(input_ids=_long(batch.input_ids).view(1, -1).to(device),
                      positions=_long(batch.positions).view(1, -1).to(device),
                      keep=keep.to(device), paged=paged)


def _per_row(batch: ForwardBatch, kv: torch.Tensor, slots, tables, ctx, qlen,
             qs) -> StepInputs:
    """Token j of the step, at position p of sequence i, attends to positions 0..p through
    i's block table: one reduction order whichever chunk or batch the token is in."""
    seq = torch.repeat_interleave(torch.arange(batch.num_seqs), qlen)
    pos = _long(batch.positions)
    if len(pos) != len(slots) or (len(pos) and (int(pos.min()) < 0
                                                or bool((pos >= ctx[seq]).any()))):
        raise ValueError("positions lie outside their sequences' contexts")
    paged = PagedStep(kv=kv, slot_mapping=slots, num_decode=len(slots), decode_groups=[],
                      spans=[], native=NativeDecode(tables[seq].contiguous(), pos + 1))
    return StepInputs(input_ids=_long(batch.input_ids).view(1, -1), positions=pos.view(1, -1),
                      keep=_keep(batch, qs), paged=paged)


def _keep(batch: ForwardBatch, qs: torch.Tensor) -> torch.Tensor:
    """The last query token of each sample row (sample_offset before it, where given),
    then the prompt-logprob rows (zero cost for a batch without them: that column is
    empty)."""
    rows = _long(batch.sample_rows)
    keep = qs[1:][rows] - 1
    if len(batch.sample_offset):
        back = _long(batch.sample_offset)
        if len(back) != len(rows) or int(back.min()) < 0 or bool(
                (back >= (qs[1:] - qs[:-1])[rows]).any()):
            raise ValueError("sample_offset points outside its sequences' query tokens")
        keep = keep - back
    if len(batch.prompt_rows) == 0:
        return keep
    rows = _long(batch.prompt_rows)
    if int(rows.min()) < 0 or int(rows.max()) >= batch.num_tokens:
        raise ValueError("prompt_rows point outside the step's tokens")
    return torch.cat([keep, rows])


def _check_tables(tables: torch.Tensor, ctx: torch.Tensor, num_blocks: int,
                  block_size: int) -> None:
    """The native kernel reads the pool at these ids unchecked: refuse what points outside."""
    if tables.numel() and (int(tables.min()) < 0 or int(tables.max()) >= num_blocks):
        raise ValueError("block_tables point outside the KV pool")
    if len(ctx) and (int(ctx.min()) < 1 or int(ctx.max()) > tables.shape[1] * block_size):
        raise ValueError("context_lens exceed the block tables")


GROUP_SLACK = 1.5   # a decode joins a group while the group's width <= 1.5x its own
MAX_GROUPS = 4      # each group is one gather + one SDPA call per layer


def decode_groups(ctx: torch.Tensor, tables: torch.Tensor, block_size: int, device,
                  window: int | None = None) -> list[DecodeGroup]:
    """Decodes split by context length (at most MAX_GROUPS) so that each group gathers
    little padding; one group, in order, when the lengths are alike. With a `window`, each
    decode sees only its last `window` positions."""
    n = len(ctx)
    if n == 0:
        return []
    widths = (ctx + block_size - 1) // block_size
    order = torch.argsort(widths, descending=True, stable=True)
    sw = widths[order].tolist()
    cuts, start = [], 0
    for i in range(1, n):
        if sw[start] > GROUP_SLACK * sw[i] and len(cuts) < MAX_GROUPS - 1:
            cuts.append(i)
            start = i
    bounds = [0, *cuts, n]
    if len(bounds) == 2:
        return [_group(None, ctx, tables, sw[0], block_size, device, window)]
    return [_group(order[a:b], ctx, tables, sw[a], block_size, device, window)
            for a, b in zip(bounds, bounds[1:])]


def _group(rows, ctx, tables, width: int, block_size: int, device, window) -> DecodeGroup:
    c = (ctx if rows is None else ctx[rows])[:, None]
    t = tables if rows is None else tables[rows]
    pos = torch.arange(width * block_size)
    mask = pos < c
    if window is not None:
        mask &= pos >= c - window
    return DecodeGroup(rows=None if rows is None else rows.to(device),
                       tables=t[:, :width].contiguous().to(device),
                       mask=mask.view(len(c), 1, 1, -1).to(device))


def _span(begin: int, end: int, context: int, table: torch.Tensor, block_size: int,
          device, window: int | None = None) -> PrefillSpan:
    """Query token i sits at position start + i and sees positions <= start + i (and
    > start + i - window): plain causal when the span is the whole context and no window
    cuts it, else a mask offset by the prefix, over the positions the window can reach."""
    start = context - (end - begin)
    first = 0 if window is None else max(0, start - window + 1)
    pos = torch.arange(first, context)
    kv_slots = seq_slots(table, pos, block_size).to(device)
    if start == 0 and (window is None or context <= window):
        return PrefillSpan(begin, end, kv_slots, None)
    query = torch.arange(start, context)[:, None]
    mask = pos[None, :] <= query
    if window is not None:
        mask &= pos[None, :] > query - window
    return PrefillSpan(begin, end, kv_slots, mask.view(1, 1, *mask.shape).to(device))


def seq_slots(table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """The KV slots of positions of one sequence with block table `table`: the formula of
    core.batch.slots (docs/design/worker.md, "Paged KV layout") on tensors."""
    return table[positions // block_size] * block_size + positions % block_size
