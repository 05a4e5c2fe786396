"""A small causal transformer (GPT-style, pre-norm) whose attention is a switch:
``naive`` (flashlab.naive_attention: N×N in memory), ``sdpa`` (PyTorch's
scaled_dot_product_attention, which picks its own backend) or ``flashlab`` (the Triton
kernels). Everything else is identical, so a comparison isolates the attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .flash_attention import MultiHeadAttention, attention
from .naive import naive_attention


def _naive(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return naive_attention(q, k, v, attn_mask, is_causal, scale, dropout_p=dropout_p)


ATTENTION = {"naive": _naive, "sdpa": F.scaled_dot_product_attention, "flashlab": attention}


class Block(nn.Module):
    """x + Attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, d_model: int, n_heads: int, attention_fn, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, causal=True, attention_fn=attention_fn, dropout=dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CausalTransformer(nn.Module):
    """Token + learned position embeddings, ``n_layers`` blocks, a final norm and a tied
    output projection. ``checkpoint_blocks`` recomputes each block's activations in the
    backward instead of storing them (activation checkpointing, per block)."""

    def __init__(self, vocab_size: int, max_len: int, d_model: int = 128, n_layers: int = 2, n_heads: int = 4,
                 attention: str = "flashlab", dropout: float = 0.0, checkpoint_blocks: bool = False):
        super().__init__()
        if attention not in ATTENTION:
            raise ValueError(f"attention: {attention!r} is not one of {sorted(ATTENTION)}.")
        self.max_len, self.checkpoint_blocks = max_len, checkpoint_blocks
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, ATTENTION[attention], dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, N)`` token ids → ``(B, N, vocab)`` logits."""
        n = tokens.shape[1]
        if n > self.max_len:
            raise ValueError(f"tokens: sequence length {n} exceeds max_len={self.max_len}.")
        x = self.tokens(tokens) + self.positions(torch.arange(n, device=tokens.device))
        for block in self.blocks:
            if self.checkpoint_blocks and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.norm(x) @ self.tokens.weight.T                 # tied input/output embedding

    def num_parameters(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tokens.weight.numel() + self.positions.weight.numel()
        return n
