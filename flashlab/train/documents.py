"""Training on documents of random lengths, packed or padded: the trainer of `flashlab.train.trainer`
on `flashlab.train.packing`'s task (``python -m flashlab train --task documents --packing packed``).

Each optimizer step draws ``batch_size`` documents (`RepeatedPatternDocuments`, a function of
seed and step) and trains the causal transformer to predict every next token inside each
document, as one of two batches of the same documents:

- packed: the tokens back to back, ``(total,)`` with ``cu_seqlens``; attention stays inside each
  document (`packing.packed_forward`: `varlen_attention`'s kernels with ``--attention flashlab``,
  else the model's attention over the packed row with a document mask);
- padded: ``(documents, longest)``, padding after each document (causal attention never lets a
  real token see it) and no loss on it.

Both give the same mean loss over the real tokens (the same targets: no loss at a document's
last token); only the work differs. ``tokens_per_s`` counts real tokens, never padding;
``real_tokens`` and ``token_slots`` (what was computed, padding included) are logged per step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import ConfigError, FieldsChecked, check_fields, option
from .model import CausalTransformer
from .packing import IGNORE_INDEX, RepeatedPatternDocuments, pack, packed_forward, packed_targets, pad, padded_targets
from .trainer import RecallConfig, Trainer


def _like_recall(name: str, help: str | None = None):
    """The `RecallConfig` field ``name`` declared again (default, range, choices, resume rule):
    both tasks build the same model, and the command line gives them one option each."""
    f = next(f for f in dataclasses.fields(RecallConfig) if f.name == name)
    m = f.metadata
    return option(f.default, help or m["help"], choices=m["choices"], low=m["low"], high=m["high"],
                  low_open=m["low_open"], high_open=m["high_open"], on_resume=m["on_resume"])


@dataclass
class DocumentsConfig(FieldsChecked):
    """The documents task (`flashlab.train.packing.RepeatedPatternDocuments`), how its batches are
    laid out, and the causal transformer (learned positions) that learns it."""

    packing: str = option("packed", "packed: documents back to back, attention inside each (varlen kernels with "
                                     "attention=flashlab, else a document mask); padded: each padded to the longest "
                                     "of its micro-batch; may change on resume", choices=("packed", "padded"))
    max_len: int = option(64, "longest document in tokens (the position table's rows)", low=2, on_resume="fixed")
    mean_fraction: float = option(0.25, "mean document length / max_len (lengths ⌈max_len·u^k⌉: mostly short "
                                        "documents, a few long ones)", low=0, low_open=True, high=1)
    max_period: int = option(8, "longest pattern a document repeats (each repeats its own of 2 … max_period "
                                "tokens)", low=2, on_resume="fixed")
    vocab_size: int = _like_recall("vocab_size", "tokens in the vocabulary")
    d_model: int = _like_recall("d_model")
    n_layers: int = _like_recall("n_layers")
    n_heads: int = _like_recall("n_heads")
    dropout: float = _like_recall("dropout", "dropout probability in attention (padded, or packed without the "
                                             "varlen kernels, which have none)")
    attention: str = _like_recall("attention")
    checkpoint_blocks: bool = _like_recall("checkpoint_blocks")

    def check(self) -> None:
        check_fields(self)
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", f"{self.n_heads} does not divide d_model={self.d_model}; pick a divisor.")
        if self.max_period > self.max_len:
            raise ConfigError("max_period", f"{self.max_period} is longer than max_len={self.max_len}: no document "
                                            f"could repeat its pattern; give at most {self.max_len}.")
        if self.packing == "packed" and self.attention == "flashlab" and self.dropout > 0:
            raise ConfigError("dropout", f"{self.dropout} with packing=packed and attention=flashlab: "
                                         "varlen_attention has no dropout; give 0, or packing=padded.")

    def resume_mismatches(self, stored: dict) -> list[str]:
        from .config import resume_mismatches
        return resume_mismatches(self, stored)


class DocumentsTrainer(Trainer):
    """The flashlab Trainer on documents of random lengths, packed or padded:
    ``DocumentsTrainer(DocumentsConfig(packing="padded"), RunConfig(steps=200))``. The per-step
    metric is next-token accuracy over the real tokens; the work per step, real tokens."""

    task_config_class = DocumentsConfig
    checkpoint_kind = "documents-training-state"
    metric_name = "accuracy"
    work_unit = "tokens"
    size_fields = ("max_len", "d_model", "n_layers", "vocab_size", "batch_size")

    def __init__(self, task: DocumentsConfig | None = None, run=None):
        self._drawn = None                           # (step, its documents)
        super().__init__(task, run)
        c = self.task_config                         # attention "auto" is resolved by now
        c.check()
        if self.world > 1 and c.packing == "packed":
            raise ConfigError("packing", "packed batches are not wired through DDP (packed_forward calls the "
                                         "model's layers directly); use packing=padded under torchrun, or one process.")
        if self.run.compile != "off" and c.packing == "packed":
            # packed_forward calls the layers itself, around varlen_attention, whose kernels torch.compile
            # cannot trace (data-dependent lengths): nothing would be compiled, and nothing would say so
            raise ConfigError("compile", "packed batches run eagerly (packed_forward calls the model's layers "
                                         "around varlen_attention, which torch.compile cannot trace); give "
                                         "--compile off, or --packing padded to compile the model.")

    def build_task(self):
        c = self.task_config
        return RepeatedPatternDocuments(c.max_len, c.mean_fraction, c.vocab_size, c.max_period)

    def build_model(self) -> torch.nn.Module:
        c = self.task_config
        return CausalTransformer(c.vocab_size, c.max_len, c.d_model, c.n_layers, c.n_heads, c.attention, c.dropout,
                                 c.checkpoint_blocks, "learned")

    def _flops_per_step(self) -> float:
        return 0.0      # the tokens of a step vary with the drawn lengths: tokens_per_s is the measure (no MFU)

    def memory_needs(self, task, run, training: bool = True) -> dict[str, float]:
        """As the base Trainer's, for a micro-batch of documents of the mean length (max_len·mean_fraction)."""
        weight = self.precision.param_dtype.itemsize
        if not training:
            return {"weights": weight * self._parameter_count(task)}
        act = self.precision.compute_dtype.itemsize
        micro = max(1, run.batch_size // (run.grad_accum * self.world))
        tokens = micro * max(1.0, task.max_len * task.mean_fraction)
        kept = 1 if task.checkpoint_blocks else 5
        return {"weights, gradients and AdamW's moments": 4 * weight * self._parameter_count(task),
                "a micro-batch's activations": tokens * (task.n_layers * kept * task.d_model * act
                                                         + 2 * 4 * task.vocab_size)}

    # ---------------------------------------------------------------- data
    def global_batch(self, step: int) -> list[torch.Tensor]:
        """Step ``step``'s documents, a function of (seed, step) only."""
        if self._drawn is None or self._drawn[0] != step:
            generator = torch.Generator().manual_seed(self.run.seed * 1_000_003 + step)
            self._drawn = (step, self.task.documents(self.run.batch_size, generator))
        return self._drawn[1]

    def micro_documents(self, step: int, micro: int, rank: int | None = None) -> list[torch.Tensor]:
        """The documents of micro-batch ``micro`` on ``rank`` (this one by default), as the base
        Trainer splits rows: any world size or accumulation sees the same data."""
        rank = self.rank if rank is None else rank
        first = (micro * self.world + rank) * self.micro_batch
        return self.global_batch(step)[first:first + self.micro_batch]

    def layout(self, documents: list[torch.Tensor]):
        """(inputs, targets) of ``documents`` as this run lays them out, on the device:
        packed ``((tokens, cu_seqlens, max_len), targets)`` or padded ``(tokens, targets)``."""
        if self.task_config.packing == "packed":
            tokens, cu_seqlens, max_len = pack(documents)
            targets = packed_targets(tokens, cu_seqlens)
            return (tokens.to(self.device), cu_seqlens.to(self.device), max_len), targets.to(self.device)
        tokens, lengths = pad(documents)
        return tokens.to(self.device), padded_targets(tokens, lengths).to(self.device)

    def batch(self, step: int, micro: int):
        return self.layout(self.micro_documents(step, micro))

    def work_per_step(self) -> int:
        """Real tokens of the step being trained (all ranks): padding is not counted."""
        return sum(len(d) for d in self.global_batch(self.step))

    def token_slots(self, step: int) -> int:
        """Token positions the step computes, padding included (all ranks and micro-batches)."""
        if self.task_config.packing == "packed":
            return sum(len(d) for d in self.global_batch(step))
        chunks = [self.micro_documents(step, m, r) for m in range(self.run.grad_accum) for r in range(self.world)]
        return sum(len(c) * max(len(d) for d in c) for c in chunks if c)

    def on_step_end(self, metrics: dict) -> None:
        step = metrics["step"]
        metrics["real_tokens"] = sum(len(d) for d in self.global_batch(step))
        metrics["token_slots"] = self.token_slots(step)

    # ---------------------------------------------------------------- loss
    def logits(self, inputs) -> torch.Tensor:
        if self.task_config.packing == "packed":
            tokens, cu_seqlens, max_len = inputs
            return packed_forward(self.model, tokens, cu_seqlens, max_len,
                                  varlen=self.task_config.attention == "flashlab")
        return self.forward_model(inputs)

    def compute_loss(self, inputs, targets):
        """(mean cross-entropy over the real next-token targets, correct predictions, targets)."""
        logits = self.logits(inputs)
        logits, targets = logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)
        answered = targets != IGNORE_INDEX
        # summed then divided: a micro-batch of one-token documents has no target (0, not 0/0 = NaN)
        loss = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum") \
            / answered.sum().clamp_min(1)
        correct = (logits.argmax(-1) == targets)[answered].sum()
        return loss, correct, answered.sum()

    @torch.no_grad()
    def evaluate(self, batches: int = 4, seed: int = 10**9) -> float:
        """Next-token accuracy over the real tokens of fresh documents (seeds far from training's)."""
        self.model.eval()
        right = total = 0
        for i in range(batches):
            documents = self.task.documents(self.micro_batch, torch.Generator().manual_seed(seed + i))
            inputs, targets = self.layout(documents)
            with self.precision.autocast(self.device.type):
                _, correct, count = self.compute_loss(inputs, targets)
            right, total = right + int(correct), total + int(count)
        self.model.train()
        return right / total if total else math.nan
