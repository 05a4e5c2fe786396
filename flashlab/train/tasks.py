"""Synthetic tasks generated on the fly: nothing to download, any sequence length.

Multi-query associative recall (MQAR; Arora et al., "Zoology", 2023): a sequence first
lists P key–value pairs, then asks about keys again; after each queried key the model must
produce that key's value. Solving it needs attention that reaches back across the whole
context (an induction head), so it exercises long-context attention, and it has a crisp
metric: the fraction of recalled values that are right.

    keys   k_1 … k_P  distinct tokens from [0, V/2)
    values v_1 … v_P  tokens from [V/2, V)
    sequence  k_1 v_1 k_2 v_2 … k_P v_P | k_a v_a k_b v_b …   (queries: random pairs again)

Targets are the next token, counted only where it is a queried value (elsewhere
``IGNORE_INDEX``).

With every query slot asking (``query_rate=1``) a key's previous mention is usually a recent
query, a few dozen tokens back, however long the sequence: the task then tests recall, not
reach. ``query_rate < 1`` thins the queries out: each slot asks with that probability and
otherwise holds two filler tokens from the value range (which never match a key), so the
previous mention of a queried key lies about 2P/query_rate tokens back, and the first
question about a key reaches back to the context at the start. `lookback` measures that
distance for every position, so accuracy can be reported by how far the model had to look.

A batch is a pure function of (seed, step, micro-step, rows), so a resumed or a data-parallel
run sees exactly the data of an uninterrupted single process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


@dataclass(frozen=True)
class AssociativeRecall:
    """MQAR with ``seq_len`` tokens per example, ``num_pairs`` key–value pairs and a
    vocabulary of ``vocab_size`` tokens (keys from the lower half, values the upper)."""

    seq_len: int = 64
    num_pairs: int = 8
    vocab_size: int = 64
    query_rate: float = 1.0

    def __post_init__(self):
        if not 0 < self.query_rate <= 1:
            raise ValueError(f"query_rate: {self.query_rate} is the probability that a query slot asks; "
                             f"give a value in (0, 1].")
        if self.vocab_size // 2 < self.num_pairs:
            raise ValueError(f"num_pairs: {self.num_pairs} distinct keys need vocab_size ≥ {2 * self.num_pairs}, "
                             f"got {self.vocab_size}. Raise vocab_size or lower num_pairs.")
        if self.seq_len + 1 < 4 * self.num_pairs:
            raise ValueError(f"seq_len: {self.seq_len} leaves no room for queries after {self.num_pairs} pairs; "
                             f"use seq_len ≥ {4 * self.num_pairs - 1}.")

    @property
    def targets_per_example(self) -> int:
        """Query slots: answer positions t = 2P, 2P+2, … < seq_len (with ``query_rate < 1``
        about that many times ``query_rate`` of them ask)."""
        return (self.seq_len - 2 * self.num_pairs + 1) // 2

    def batch(self, rows: int, seed: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``rows`` examples drawn from ``seed``: inputs and targets, both ``(rows, seq_len)`` int64."""
        g = torch.Generator().manual_seed(seed)
        half, P = self.vocab_size // 2, self.num_pairs
        keys = torch.rand(rows, half, generator=g).argsort(dim=1)[:, :P]           # P distinct keys per row
        values = torch.randint(half, self.vocab_size, (rows, P), generator=g)
        n_queries = self.targets_per_example + 1                                   # enough for seq_len + 1 tokens
        asked = torch.randint(0, P, (rows, n_queries), generator=g)
        context = torch.stack([keys, values], dim=2).flatten(1)                    # k1 v1 k2 v2 …
        queries = torch.stack([keys.gather(1, asked), values.gather(1, asked)], dim=2)   # (rows, slots, 2)
        asks = torch.ones(rows, n_queries, dtype=torch.bool)
        if self.query_rate < 1:                   # (drawn only here, so query_rate = 1 keeps its old batches)
            asks = torch.rand(rows, n_queries, generator=g) < self.query_rate
            filler = torch.randint(half, self.vocab_size, (rows, n_queries, 2), generator=g)
            queries = torch.where(asks[..., None], queries, filler)
        tokens = torch.cat([context, queries.flatten(1)], dim=1)[:, : self.seq_len + 1]
        inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        is_answer = torch.zeros_like(targets, dtype=torch.bool)
        is_answer[:, 2 * P::2] = asks[:, : self.targets_per_example]               # a queried value comes next
        targets[~is_answer] = IGNORE_INDEX
        return inputs.to(device), targets.to(device)


def lookback(tokens: torch.Tensor) -> torch.Tensor:
    """For every position t of ``tokens (B, N)``: t − s for the latest s < t with the same
    token, 0 where the token has not occurred before. At an answer position of MQAR the
    token is the queried key, so this is how far back the model must look for it.

    One stable sort groups equal tokens with their positions in order; neighbours in that
    order that hold the same token are consecutive occurrences (O(N log N), any length)."""
    order = torch.sort(tokens, dim=1, stable=True).indices
    grouped = tokens.gather(1, order)
    repeat = grouped[:, 1:] == grouped[:, :-1]
    gap = torch.where(repeat, order[:, 1:] - order[:, :-1], 0)
    distance = torch.zeros_like(tokens)
    distance.scatter_(1, order[:, 1:], gap)
    return distance
