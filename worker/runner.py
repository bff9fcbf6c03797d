"""ModelRunner: one HF causal LM, its paged KV pool, and the sampler (with the constrained
rows' matchers, worker/grammar.py: a cache the batches keep right)."""
from __future__ import annotations

import torch

from core.ipc.protocol import I32, ForwardBatch, ModelInfo, StepResult
from worker import archs, fused_llama, graph, invariant, native, prompt_scores
from worker.pooling import Pooler
from worker.linear import packed, quant_fuse, rows
from worker.linear.quant_module import QuantLinear
from worker.attention import KWARG
from worker.grammar import Grammars
from worker.handmade import Part, make_batch
from worker.sampler import sample_step
from worker.step import StepInputs, build_step


class ModelRunner:
    """Stateless apart from the KV tensor and the matchers' cache: every ForwardBatch
    carries all a step needs."""

    def __init__(self, model, kv: torch.Tensor, info: ModelInfo):
        self.model = model
        self.kv = kv
        self.info = info
        cfg = model.config
        rep = cfg.num_attention_heads // (getattr(cfg, "num_key_value_heads", None)
                                          or cfg.num_attention_heads)
        self.windows = archs.windows(cfg)
        self.native = archs.plain_attention(cfg) and native.usable(kv, rep)
        self.per_row = info.batch_invariant   # docs/design/cpu-paths.md, "Batch-invariant mode"
        self.grammars = Grammars(info.tokenizer, info.vocab_size, info.eos_ids)
        if self.per_row:
            invariant.check_supported(model, kv, rep, info.tp)
        self.drafter = None   # worker/draft.py, where the worker was given a draft model
        self.pooler = Pooler(model)   # embeddings: the final norm's output at pooled rows
        self.graph: graph.DecodeGraph | None = None
        weights: list[torch.Tensor] = []
        if fused_llama.usable(model, info.tp):   # the small per-token ops in C
            fused_llama.adapt(model)
        if any(isinstance(m, QuantLinear) for m in model.modules()):
            quant_fuse.fuse(model, self.probe)   # sibling layers as one weight
        if packed.usable(model, info.tp):   # docs/design/cpu-paths.md, "Packed linear layers"
            groups = packed.siblings(model, self.probe)
            weights = packed.pack(model, groups,
                                  rows.matmul_plan if self.per_row else packed.dense_plan)
        elif self.per_row:
            rows.make_invariant(model)
        if (self.native or self.per_row) and info.tp == 1:   # "The decode graph"
            self.graph = graph.capture(self, weights)

    def probe(self) -> None:
        """One forward of one token into block 0, so that a keyword the paged attention does
        not implement fails at load. Harmless: every slot is written before it is read."""
        self.logits(make_batch([Part([0], 0, 1, [0])], self.info.block_size))

    @torch.inference_mode()
    def logits(self, batch: ForwardBatch) -> torch.Tensor:
        """[num_sample_rows + len(prompt_rows), vocab] logits of the sampled rows, in
        sample_rows order, then those of the prompt-logprob rows."""
        prompt_scores.check(batch, self.info.vocab_size)   # on every rank, before a collective
        pools = self.pooler.arm(batch)
        if batch.num_tokens == 0:
            return torch.empty(0, self.info.vocab_size, dtype=self.kv.dtype, device=self.kv.device)
        s = build_step(batch, self.kv, self.native, self.windows, self.per_row)
        if not pools and self.graph is not None and self.graph.takes(s):
            return self.graph(s)
        return self.eager_logits(s)

    @torch.inference_mode()
    def eager_logits(self, s: StepInputs) -> torch.Tensor:
        out = self.model(input_ids=s.input_ids, position_ids=s.positions, use_cache=False,
                         logits_to_keep=s.keep, **{KWARG: s.paged})
        return out.logits[0]

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> StepResult:
        """One token per sample row, in sample_rows order, and the logprobs asked for;
        first the draft model's drafts where the batch leaves them to it."""
        drafts = I32()
        if len(batch.draft_seqs):
            if self.drafter is None:
                raise ValueError("the batch asks for a draft model's drafts; this worker has"
                                 " none (worker --draft)")
            drafts = self.drafter.fill(batch)
        logits = self.logits(batch)
        rows = len(batch.sample_rows)
        ps = prompt_scores.score(logits[rows:], batch)
        out = StepResult(step=batch.step, tokens=I32(), prompt_logprobs=ps.logprobs,
                         prompt_ranks=ps.ranks, prompt_top_ids=ps.top_ids,
                         prompt_top_logprobs=ps.top_logprobs, drafts=drafts,
                         pooled=self.pooler.take())
        if rows == 0:
            return out
        tokens, lp = sample_step(logits[:rows], batch, self.grammars)
        out.tokens = I32(tokens.to(torch.int32).numpy().tobytes())
        out.logprobs, out.top_ids, out.top_logprobs = lp.chosen, lp.top_ids, lp.top_logprobs
        return out

    def execute(self, batch: ForwardBatch) -> I32:
        """run()'s tokens."""
        return self.run(batch).tokens
