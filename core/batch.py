"""The ForwardBatch layout (no torch here): `layout` lays out any sequences; `build_batch`
feeds it one ScheduleOutput, worker/handmade.py hand-made parts.

Built column by column with comprehensions and one array conversion per field: this is
on the step loop's critical path, and per-field appends cost more than the scheduling.
"""
from __future__ import annotations

from itertools import chain, islice, repeat
from typing import Mapping, Sequence

from core.first_samples import FirstSamples
from core.ipc.protocol import F64, I32, I64, ForwardBatch, SamplingParams
from core.speculate import PENDING
from core.table_growth import KeptTables

GREEDY = SamplingParams()


def slots(tables: Sequence[Sequence[int]], positions: Sequence[int], block_size: int) -> list[int]:
    """The KV slot of each position p, tables[i] being the block table of positions[i]'s
    sequence: T[p // block_size] * block_size + p % block_size (docs/design/worker.md, "Paged KV
    layout"; worker/step.py's `seq_slots` is the same formula on tensors)."""
    bs = block_size
    return [t[p // bs] * bs + p % bs for t, p in zip(tables, positions)]


def layout(step: int, block_size: int, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]],
           tables: Sequence[Sequence[int]], num_decode: int, spans: Sequence[tuple[int, int]],
           rows: Sequence[int], params: Sequence[SamplingParams],
           gen_index: Sequence[int], banned: Sequence[Sequence[int]] = (),
           kept: KeptTables | None = None,
           first: Sequence[bool] | None = None,
           offsets: Sequence[int] = ()) -> ForwardBatch:
    """Sequence i has tokens[i] and block table tables[i]. The first num_decode query one
    token, their last (position len - 1); each later one queries positions [start, end) of
    spans[i - num_decode] and has `end` tokens in cache afterwards. Sample row j is
    sequence rows[j], sampled with params[j] as generated token number gen_index[j], never
    drawing a token of banned[j] (empty: no bans). Tables are padded with 0 to the widest,
    through `kept` when given (a scheduler's live tables: core/table_growth.py). first[j]:
    row j is its request's first sample since (re)admission (core/first_samples.py; default:
    the rows of prefill chunks). offsets[j] (empty: all 0): row j samples the query token
    that many before its sequence's last (a sequence verifying drafts samples every one)."""
    dec = tokens[:num_decode]
    ctx = [len(t) for t in dec]
    ids = [t[-1] for t in dec]
    pos = [n - 1 for n in ctx]
    tok_tables = list(tables[:num_decode])   # each query token's block table
    qstart = list(range(num_decode + 1))
    q = num_decode
    for toks, tb, (start, end) in zip(islice(tokens, num_decode, None),
                                      islice(tables, num_decode, None), spans):
        ids.extend(toks[start:end])
        pos.extend(range(start, end))
        tok_tables.extend(repeat(tb, end - start))
        ctx.append(end)
        q += end - start
        qstart.append(q)
    width = max(map(len, tables), default=0)
    batch = ForwardBatch(
        step=step, seq_ids=I32(seq_ids), input_ids=I32(ids), positions=I32(pos),
        slot_mapping=I32(slots(tok_tables, pos, block_size)), query_start=I32(qstart),
        context_lens=I32(ctx),
        block_tables=(kept.padded(seq_ids, tables, width) if kept is not None
                      else I32(_padded(tables, width))),
        table_width=width, sample_rows=I32(rows),
        temperature=F64([p.temperature for p in params]), top_p=F64([p.top_p for p in params]),
        top_k=I32([p.top_k for p in params]),
        seeds=I64([p.seed if p.seed is not None else 0 for p in params]),
        gen_index=I32(gen_index))
    if any(offsets):
        batch.sample_offset = I32(offsets)
    constrained = any(p.constraint is not None for p in params)
    if (constrained or any(banned)
            or any(p.min_p or p.penalized or p.logprobs is not None for p in params)):
        ends = [len(t) for t in dec] + [end for _, end in spans]
        history = [tokens[r][:ends[r]] for r in rows]
        _processors(batch, history, params, gen_index, banned)
        if constrained:
            _grammars(batch, history, params, gen_index,
                      [r >= num_decode for r in rows] if first is None else first)
    return batch


def _grammars(b: ForwardBatch, history: Sequence[Sequence[int]],
              params: Sequence[SamplingParams], gen_index: Sequence[int],
              first: Sequence[bool]) -> None:
    """The constrained rows' columns (see ForwardBatch): each row's constraint key and
    generated tokens; the specs of those whose row is a prefill's last chunk (the first
    sample since the request was admitted or recomputed)."""
    cons = [p.constraint for p in params]
    b.grammar = [c.key if c is not None else "" for c in cons]
    gen = [h[len(h) - g:] if c is not None else () for h, g, c in zip(history, gen_index, cons)]
    b.grammar_tokens = I32(chain.from_iterable(gen))
    b.grammar_start = I32(_offsets(gen))
    specs = {c.key: [c.key, c.kind, c.text] for c, f in zip(cons, first) if c is not None and f}
    b.grammar_specs = list(specs.values())


def _processors(b: ForwardBatch, history: Sequence[Sequence[int]],
                params: Sequence[SamplingParams], gen_index: Sequence[int],
                banned: Sequence[Sequence[int]]) -> None:
    """The logits processors' columns (see ForwardBatch), each only when some row uses it.
    history[j] is row j's tokens up to its query end: prompt, then gen_index[j] generated."""
    if any(p.min_p for p in params):
        b.min_p = F64([p.min_p for p in params])
    if any(p.penalized for p in params):
        b.presence = F64([p.presence_penalty for p in params])
        b.frequency = F64([p.frequency_penalty for p in params])
        b.repetition = F64([p.repetition_penalty for p in params])
        kept = [h if p.penalized else () for h, p in zip(history, params)]
        b.history = I32(chain.from_iterable(kept))
        b.history_start = I32(_offsets(kept))
        b.history_prompt = I32([len(h) - g if h else 0 for h, g in zip(kept, gen_index)])
    if any(banned):
        b.banned = I32(chain.from_iterable(banned))
        b.banned_start = I32(_offsets(banned))
    if any(p.logprobs is not None for p in params):
        b.logprobs = I32([-1 if p.logprobs is None else p.logprobs for p in params])


def _padded(tables: Sequence[Sequence[int]], width: int) -> list[int]:
    out: list[int] = []
    extend = out.extend
    for t in tables:
        extend(t)
        if len(t) < width:
            extend([0] * (width - len(t)))
    return out


def _offsets(lists: Sequence[Sequence[int]]) -> list[int]:
    out = [0]
    for x in lists:
        out.append(out[-1] + len(x))
    return out


def build_batch(step: int, out, sched, sampling: Mapping[int, SamplingParams],
                stop_ids: Mapping[int, Sequence[int]] | None = None,
                kept: KeptTables | None = None,
                firsts: FirstSamples | None = None) -> ForwardBatch:
    """Decodes first (one query token at position n-1), then the decodes with drafts
    (out.drafts: k drafts query positions n-1..n+k-1 and sample all k+1 rows), then
    prefill chunks in order (docs/design/scheduler.md, "Speculative decoding").

    A decode and a chunk with `last` sample; the sampled token is the request's k-th
    generated token, k = len(tokens) - prompt_len (what stateless seeding keys on), plus i
    for row i of a decode with drafts. stop_ids[id]: the tokens that would end request id
    (EOS, stop_token_ids), banned while it has fewer than its min_tokens generated tokens.
    `firsts`: the engine's record of which rows are first samples (without it, a decode
    never is).
    """
    plain, spec = _decodes(out)
    n_dec, n_spec = len(plain), len(plain) + len(spec)
    seq_ids = [*plain, *spec, *(ch.id for ch in out.prefill)]
    tokens, table = sched.tokens, sched.blocks.block_table
    toks = [tokens(r) for r in seq_ids]
    prompt_len = sched.prompt_len
    drafted = [len(out.drafts[i]) for i in spec]
    lasts = [n_spec + i for i, ch in enumerate(out.prefill) if ch.last]
    rows = [*range(n_dec), *(n_dec + s for s, k in enumerate(drafted) for _ in range(k + 1)),
            *lasts]
    sample_ids = [seq_ids[r] for r in rows]
    params = [sampling.get(r, GREEDY) for r in sample_ids]
    gen = [len(toks[r]) - prompt_len(i) for r, i in zip(rows, sample_ids)]
    spans = [(ch.start, ch.start + ch.length) for ch in out.prefill]
    offsets: list[int] = []
    if spec:   # row i of k+1 is i tokens later than the decode's own
        ahead = [i for k in drafted for i in range(k + 1)]
        gen[n_dec:n_dec + len(ahead)] = [g + i for g, i in zip(gen[n_dec:], ahead)]
        offsets = [0] * n_dec + [k - i for k in drafted for i in range(k + 1)] + [0] * len(lasts)
        spans = [(len(toks[n_dec + s]) - 1, len(toks[n_dec + s]) + k)
                 for s, k in enumerate(drafted)] + spans
        for s, i in enumerate(spec):
            toks[n_dec + s] = [*toks[n_dec + s], *out.drafts[i]]
    banned = ()
    if stop_ids is not None and any(p.min_tokens for p in params):
        banned = [stop_ids.get(i, ()) if g < p.min_tokens else ()
                  for i, p, g in zip(sample_ids, params, gen)]
    first = firsts.of(out, tokens) if firsts is not None else None
    if first is not None and spec:
        of = dict(zip(out.decode, first))
        first = [of[i] for i in plain] + [False] * (len(rows) - n_dec - len(lasts)) + first[
            len(out.decode):]
    batch = layout(step, sched.blocks.block_tokens(), seq_ids, toks,
                   [table(r) for r in seq_ids], n_dec, spans, rows, params, gen, banned, kept,
                   first, offsets)
    if spec and out.drafts[spec[0]][0] == PENDING:
        _model_drafts(batch, spec, n_dec, sched)
    if out.pooled:
        _pool_rows(batch, out, n_spec)
    return batch


def _pool_rows(batch: ForwardBatch, out, n_spec: int) -> None:
    """The last query token of each pooled chunk (out.pooled, in prefill order): the
    sequence n_spec + i of prefill chunk i ends one token before query_start[n_spec + i + 1]."""
    pooled, qs = set(out.pooled), batch.query_start
    batch.pool_rows = I32([qs[n_spec + i + 1] - 1 for i, ch in enumerate(out.prefill)
                           if ch.id in pooled])


def _model_drafts(batch: ForwardBatch, spec: Sequence[int], n_dec: int, sched) -> None:
    """The draft-model section (see ForwardBatch): every decode with drafts, and the tokens
    before its last that the draft model has not seen."""
    context = [sched.tokens(i)[sched.draft_seen(i):-1] for i in spec]
    batch.draft_seqs = I32(range(n_dec, n_dec + len(spec)))
    batch.draft_context = I32(chain.from_iterable(context))
    batch.draft_context_start = I32(_offsets(context))


def _decodes(out) -> tuple[list[int], list[int]]:
    """out.decode split into those without drafts and those with, each in decode order."""
    drafts = out.drafts
    if not drafts:
        return out.decode, []
    return [i for i in out.decode if i not in drafts], [i for i in out.decode if i in drafts]


def sampled_ids(out) -> list[int]:
    """The request id of each sample row of build_batch(out), in the worker's token order."""
    plain, spec = _decodes(out)
    return [*plain, *(i for i in spec for _ in range(len(out.drafts[i]) + 1)),
            *(c.id for c in out.prefill if c.last)]


def fill_ahead(batch: ForwardBatch, step: int, tokens: Sequence[int] | None) -> bool:
    """Replace the placeholders of `batch` (see ForwardBatch) with `tokens`, the sampled
    tokens of `step`. False when they are not those of batch.prev_step: the placeholders
    become 0 (a stale batch; the core ignores its result)."""
    if batch.prev_step < 0:
        return True
    ok = tokens is not None and step == batch.prev_step
    for name in ("input_ids", "history", "grammar_tokens"):
        col = getattr(batch, name)
        if len(col) and min(col) < 0:
            setattr(batch, name, I32([t if t >= 0 else (tokens[-1 - t] if ok else 0) for t in col]))
    return ok
