"""A small causal transformer (GPT-style, pre-norm) whose attention is a switch:
``naive`` (flashlab.naive_attention: N×N in memory), ``sdpa`` (PyTorch's
scaled_dot_product_attention, which picks its own backend) or ``flashlab`` (the Triton
kernels). Everything else is identical, so a comparison isolates the attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from flashlab.api.attention import MultiHeadAttention, attention
from flashlab.reference.naive import naive_attention


def _naive(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return naive_attention(q, k, v, attn_mask, is_causal, scale, dropout_p=dropout_p)


ATTENTION = {"naive": _naive, "sdpa": F.scaled_dot_product_attention, "flashlab": attention}


def rotary(x: torch.Tensor, base: float = 10000.0, dims: int | None = None) -> torch.Tensor:
    """Rotary position embedding (Su et al., "RoFormer", 2021) of ``x (…, N, D)``: the pair
    (x_i, x_{i+R/2}) at position n is rotated by the angle n·θ_i, θ_i = base^(−2i/R), for the
    first R = ``dims`` (even; default all D) dimensions. A rotated query and key have a dot
    product that depends on their positions only through n_q − n_k, so the model sees
    relative positions at any length it is run at.

    The dimensions past R are left alone (GPT-NeoX's partial rotary). Why keep some: the
    slowest pair turns by Δ·base^(−(R−2)/R) radians over a distance Δ, 8.7 rad at Δ = 65536
    with R = 64. Over such distances every rotated pair swings through whole turns, so no
    rotated dimension can say "same token" the same way near and far; an unrotated one can."""
    d = x.shape[-1]
    dims = d if dims is None else dims
    if dims % 2 or not 0 < dims <= d:
        raise ValueError(f"dims: {dims} must be even and in (0, {d}] (the head dimension).")
    n, half = x.shape[-2], dims // 2
    theta = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = torch.arange(n, device=x.device, dtype=torch.float32)[:, None] * theta        # (N, R/2), fp32
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half].float(), x[..., half:dims].float()
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)
    return rotated if dims == d else torch.cat([rotated, x[..., dims:]], dim=-1)


def rotary_dims(head_dim: int, fraction: float) -> int:
    """How many of ``head_dim`` dimensions a rotary ``fraction`` rotates: the nearest even
    count, at least 2."""
    if not 0 < fraction <= 1:
        raise ValueError(f"rotary_fraction: {fraction} is the share of each head's dimensions to rotate; "
                         f"give a value in (0, 1].")
    return max(2, 2 * round(fraction * head_dim / 2))


def with_rotary(attention_fn, fraction: float = 1.0):
    """``attention_fn`` with rotary position embeddings applied to its queries and keys
    (to the first ``fraction`` of each head's dimensions)."""
    def rotary_attention(q, k, v, **kwargs):
        dims = rotary_dims(q.shape[-1], fraction)
        return attention_fn(rotary(q, dims=dims), rotary(k, dims=dims), v, **kwargs)
    return rotary_attention


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
    """Token embeddings, ``n_layers`` blocks, a final norm and a tied output projection.
    ``positions``: "learned" (an embedding per position, added to the tokens) or "rotary"
    (queries and keys rotated by position inside every attention: no position parameters,
    and relative offsets look the same at every length; ``rotary_fraction`` of each head's
    dimensions rotate, the rest carry content only). ``checkpoint_blocks`` recomputes
    each block's activations in the backward instead of storing them (per block)."""

    def __init__(self, vocab_size: int, max_len: int, d_model: int = 128, n_layers: int = 2, n_heads: int = 4,
                 attention: str = "flashlab", dropout: float = 0.0, checkpoint_blocks: bool = False,
                 positions: str = "learned", rotary_fraction: float = 1.0):
        super().__init__()
        if attention not in ATTENTION:
            raise ValueError(f"attention: {attention!r} is not one of {sorted(ATTENTION)}.")
        if positions not in ("learned", "rotary"):
            raise ValueError(f"positions: {positions!r} is not 'learned' or 'rotary'.")
        rotary_dims(d_model // n_heads, rotary_fraction)                    # a bad fraction fails here, not later
        self.max_len, self.checkpoint_blocks = max_len, checkpoint_blocks
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_len, d_model) if positions == "learned" else None
        attention_fn = ATTENTION[attention]
        if positions == "rotary":
            attention_fn = with_rotary(attention_fn, rotary_fraction)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, attention_fn, dropout) for _ in range(n_layers))
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
        if self.positions is not None and n > self.max_len:        # rotary positions have no table to run off
            raise ValueError(f"tokens: sequence length {n} exceeds max_len={self.max_len}.")
        x = self.tokens(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(n, device=tokens.device))
        for block in self.blocks:
            if self.checkpoint_blocks and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.norm(x) @ self.tokens.weight.T                 # tied input/output embedding

    def num_parameters(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tokens.weight.numel() + (self.positions.weight.numel() if self.positions is not None else 0)
        return n
