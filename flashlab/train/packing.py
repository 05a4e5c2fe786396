"""Packed training: documents of random lengths, concatenated without padding, attended with
`flashlab.varlen_attention` so that no token sees another document, and the throughput of that
against padding every document to the longest.

- `RepeatedPatternDocuments`: a task whose documents have random lengths: each document
  repeats a random pattern of its own, so predicting its next token needs attention *within* the
  document (copy from one period back), and attending into a neighbour only hurts.
- `pack` / `pad`: the two ways to batch documents: (total_tokens,) with ``cu_seqlens``, or
  (batch, max_len) with a padding mask.
- `packed_forward`: a `flashlab.train.model.CausalTransformer`'s forward on a packed batch (same
  weights; positions restart at every document; attention by `varlen_attention`).
- `training_throughput`: real (non-padding) tokens per second of forward + backward, packed or
  padded.

A padded batch computes attention over B·N_max² score entries per head and every other layer
over B·N_max tokens; packed, Σ_b n_b² and Σ_b n_b. With mean length = N_max/4, padding wastes 3
of every 4 token slots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flashlab.api.varlen import cu_seqlens_from_lengths, varlen_attention

from .model import CausalTransformer

IGNORE_INDEX = -100


@dataclass(frozen=True)
class RepeatedPatternDocuments:
    """Documents of random lengths L = ⌈max_len · u^k⌉ (u uniform in (0, 1), k = 1/mean_fraction − 1),
    so E[L] ≈ mean_fraction · max_len (E[u^k] = 1/(k + 1)) and the longest of a batch is near
    max_len: mostly short documents and a few long ones, like real corpora. Document d repeats a
    random pattern of ``period`` tokens (2 ≤ period ≤ ``max_period``) from ``vocab_size`` tokens."""

    max_len: int = 256
    mean_fraction: float = 0.25
    vocab_size: int = 64
    max_period: int = 8

    def __post_init__(self):
        if not (0 < self.mean_fraction <= 1 and self.max_len >= 1):
            raise ValueError(f"mean_fraction: {self.mean_fraction} must lie in (0, 1] (mean length / max_len), "
                             f"and max_len ≥ 1 (got {self.max_len}).")
        if self.max_period < 2 or self.vocab_size < 2:
            raise ValueError("max_period and vocab_size: need at least 2 each.")

    def documents(self, n: int, generator: torch.Generator) -> list[torch.Tensor]:
        """``n`` documents (1-D int64 tensors of random lengths)."""
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        exponent = 1 / self.mean_fraction - 1
        lengths = (self.max_len * u ** exponent).ceil().clamp(1, self.max_len).long()
        docs = []
        for length in lengths.tolist():
            period = int(torch.randint(2, self.max_period + 1, (), generator=generator))
            pattern = torch.randint(0, self.vocab_size, (period,), generator=generator)
            docs.append(pattern.repeat(-(-length // period))[:length])
        return docs


def _check_documents(documents) -> None:
    """One line for what torch.cat and the padding loop would otherwise fail on deep inside."""
    if isinstance(documents, torch.Tensor) or not documents:
        raise ValueError("documents: expected a non-empty list of 1-D token tensors, got "
                         + ("a tensor; pass list(tensor) for a batch of rows" if isinstance(documents, torch.Tensor)
                            else "an empty list"))
    for i, d in enumerate(documents):
        if not isinstance(d, torch.Tensor) or d.dim() != 1:
            shape = f"shape {tuple(d.shape)}" if isinstance(d, torch.Tensor) else type(d).__name__
            raise ValueError(f"documents: entry {i} is {shape}; each document is a 1-D tensor of token ids")
        if d.dtype != documents[0].dtype:
            raise ValueError(f"documents: entry {i} is {d.dtype} but entry 0 is {documents[0].dtype}; "
                             "give every document the same integer dtype")


def pack(documents: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Documents back to back: tokens ``(total,)``, ``cu_seqlens`` (int32, n + 1) and the longest length."""
    _check_documents(documents)
    lengths = [len(d) for d in documents]
    return torch.cat(documents), cu_seqlens_from_lengths(lengths), max(lengths)   # non-empty: checked


def pad(documents: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Documents padded to the longest: tokens ``(n, max_len)`` and lengths ``(n,)``."""
    _check_documents(documents)
    lengths = torch.tensor([len(d) for d in documents])
    tokens = torch.full((len(documents), int(lengths.max())), pad_id, dtype=documents[0].dtype)
    for i, d in enumerate(documents):
        tokens[i, :len(d)] = d
    return tokens, lengths


def packed_targets(tokens: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Next-token targets of a packed batch: token t + 1, except at each document's last token
    (its successor belongs to the next document), which gets IGNORE_INDEX."""
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:-1] = tokens[1:]
    ends = cu_seqlens[1:].long() - 1
    targets[ends[ends >= 0]] = IGNORE_INDEX
    return targets


def padded_targets(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Next-token targets of a padded batch: IGNORE_INDEX at each document's last token and on padding."""
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, :-1] = tokens[:, 1:]
    position = torch.arange(tokens.shape[1], device=tokens.device)
    targets[position[None, :] >= (lengths.to(tokens.device) - 1)[:, None]] = IGNORE_INDEX
    return targets


def _positions(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Each packed token's position inside its own document: t − cu_seqlens[document of t]."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lengths, output_size=total)
    return torch.arange(total, device=cu_seqlens.device) - starts


def document_mask(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Boolean (total, total): packed token t may attend to token s iff both lie in the same
    document and s ≤ t. What a packed batch needs from an attention without varlen support."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    document = torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device), lengths,
                                       output_size=total)
    position = torch.arange(total, device=cu_seqlens.device)
    return (document[:, None] == document[None, :]) & (position[None, :] <= position[:, None])


def packed_forward(model: CausalTransformer, tokens: torch.Tensor, cu_seqlens: torch.Tensor,
                   max_seqlen: int, varlen: bool = True) -> torch.Tensor:
    """``model``'s forward on a packed batch: ``(total,)`` token ids → ``(total, vocab)`` logits.

    The same weights and operations as ``model(tokens)`` on each document alone (learned
    positions restart at 0 in every document; causal attention stays inside it), with the
    attention computed by `varlen_attention` over the packed (total, heads, D) tensors.

    ``varlen=False``: the model's own attention function (SDPA, naive …) over the whole packed
    row with `document_mask` instead: the same numbers, but total² scores per head rather than
    Σ n_b², so only the layers outside attention gain from packing. It is the CPU's packed path
    (`varlen_attention` there runs in Triton's interpreter, ~100× slower than SDPA)."""
    if model.positions is None:
        raise ValueError("model: packed_forward supports positions='learned' only (rotary positions would "
                         "need per-document positions inside the attention).")
    if max_seqlen > model.max_len:
        raise ValueError(f"max_seqlen: {max_seqlen} exceeds the model's max_len={model.max_len}.")
    if varlen and model.training and any(block.attn.dropout for block in model.blocks):
        # varlen_attention has no dropout: training would silently go without it
        raise ValueError("model: attention dropout is on (training mode) and varlen_attention has none; set the "
                         "model's attention dropout to 0, call model.eval(), or pass varlen=False.")
    total = tokens.shape[0]
    if cu_seqlens.numel() < 1 or int(cu_seqlens[-1]) != total:
        raise ValueError(f"cu_seqlens: ends at {int(cu_seqlens[-1]) if cu_seqlens.numel() else 'nothing'} but "
                         f"tokens holds {total}; build both with flashlab.train.packing.pack(documents).")
    x = model.tokens(tokens) + model.positions(_positions(cu_seqlens, total))
    mask = None if varlen else document_mask(cu_seqlens, total)
    for block in model.blocks:
        attn = block.attn
        qkv = attn.qkv(block.norm1(x)).view(total, 3, attn.num_heads, attn.head_dim)
        q, k, v = qkv.unbind(1)                                          # (total, heads, D) views
        if varlen:
            y = varlen_attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, is_causal=True)
        else:                                                            # (heads, total, D) for SDPA's layout
            dropout = attn.dropout if attn.training else 0.0
            y = attn.attention_fn(*(t.transpose(0, 1) for t in (q, k, v)), attn_mask=mask,
                                  dropout_p=dropout).transpose(0, 1)
        x = x + attn.out(y.reshape(total, -1))
        x = x + block.mlp(block.norm2(x))
    return model.norm(x) @ model.tokens.weight.T


def padded_loss(model: CausalTransformer, documents: list[torch.Tensor], device) -> tuple[torch.Tensor, int]:
    """Mean next-token loss of the documents as one padded batch; and the batch's token slots."""
    tokens, lengths = pad(documents)
    tokens = tokens.to(device)
    logits = model(tokens)
    targets = padded_targets(tokens, lengths)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX), tokens.numel()


def packed_loss(model: CausalTransformer, documents: list[torch.Tensor], device,
                varlen: bool = True) -> tuple[torch.Tensor, int]:
    """Mean next-token loss of the documents as one packed batch; and its token slots (= real tokens)."""
    tokens, cu_seqlens, max_len = pack(documents)
    tokens, cu_seqlens = tokens.to(device), cu_seqlens.to(device)
    logits = packed_forward(model, tokens, cu_seqlens, max_len, varlen)
    targets = packed_targets(tokens, cu_seqlens)
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX), tokens.numel()


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def training_throughput(model: CausalTransformer, batches: list[list[torch.Tensor]], packed: bool,
                        device="cpu", warmup: int = 1) -> dict:
    """Forward + backward over ``batches`` (lists of documents), packed or padded.

    Returns real tokens (the documents' own) per second, the token slots computed (padding
    included) and the seconds timed; the first ``warmup`` batches are run but not timed
    (compilation, autotuning, allocator)."""
    loss_fn = packed_loss if packed else padded_loss
    real = slots = 0
    elapsed = 0.0
    for i, documents in enumerate(batches):
        _sync(device)
        start = time.perf_counter()
        loss, n_slots = loss_fn(model, documents, device)
        loss.backward()
        _sync(device)
        if i >= warmup:
            elapsed += time.perf_counter() - start
            real += sum(len(d) for d in documents)
            slots += n_slots
    model.zero_grad(set_to_none=True)
    return {"mode": "packed" if packed else "padded", "real_tokens": real, "token_slots": slots,
            "seconds": elapsed, "tokens_per_s": real / elapsed if elapsed > 0 else float("nan")}
