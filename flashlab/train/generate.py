"""Greedy generation with `CausalTransformer` against a paged KV cache, through FlashAttention's
``flash_attn_with_kvcache`` (`flashlab.flash_attn_interface`): each step writes the new tokens' keys and
values into the cache's pages and attends to the grown cache in the same call, as a serving loop does.

    cache = PagedKVCache.empty(model, batch=2, capacity=256, page_size=16)
    tokens = generate(model, prompt, steps=20, cache=cache)       # (batch, prompt + 20) token ids

The cache is a fixed pool of pages per layer and a block table (pages handed out shuffled, as an
allocator that reuses freed pages would), so a step has the same shapes whatever the lengths: it
compiles once (``torch.compile(fullgraph=True)``) and replays in a CUDA graph. Only learned positions
(``positions="learned"``): a rotary model rotates q and k by absolute position, which this step does
not do."""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashlab.api.flash_attn_interface import flash_attn_with_kvcache

from .model import CausalTransformer


class PagedKVCache(NamedTuple):
    """Keys and values of every layer: ``k``, ``v`` ``(layers, num_blocks, page_size, heads, head_dim)``;
    ``block_table`` int32 ``(batch, pages per sequence)``; ``seqlens`` int32 ``(batch,)``, tokens cached."""

    k: torch.Tensor
    v: torch.Tensor
    block_table: torch.Tensor
    seqlens: torch.Tensor

    @classmethod
    def empty(cls, model: CausalTransformer, batch: int, capacity: int, page_size: int = 16,
              dtype: torch.dtype | None = None, seed: int = 0) -> PagedKVCache:
        """Room for ``capacity`` tokens per sequence in pages of ``page_size``, pages shuffled over the pool."""
        attn = model.blocks[0].attn
        weight = model.tokens.weight
        pages = -(-capacity // page_size)
        shape = (len(model.blocks), batch * pages, page_size, attn.num_heads, attn.head_dim)
        k = torch.zeros(shape, dtype=dtype or weight.dtype, device=weight.device)
        order = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(seed))
        table = order.view(batch, pages).to(device=weight.device, dtype=torch.int32)
        return cls(k, torch.zeros_like(k), table, torch.zeros(batch, dtype=torch.int32, device=weight.device))


def decode_step(model: CausalTransformer, tokens: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
    """Logits ``(batch, n, vocab)`` of ``n`` new tokens per sequence (the prompt, or one generated token)
    at positions cache.seqlens … + n − 1; their keys and values are written into the cache. The caller
    advances ``cache.seqlens`` by n afterwards (kept out of the step, so a captured step reads it fresh)."""
    if model.positions is None:
        raise NotImplementedError("model: decode_step supports learned positions only; a rotary model "
                                  "(positions='rotary') needs q and k rotated by absolute position here.")
    batch, n = tokens.shape
    positions = cache.seqlens.long()[:, None] + torch.arange(n, device=tokens.device)
    x = model.tokens(tokens) + model.positions(positions)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        q, k, v = attn.qkv(block.norm1(x)).view(batch, n, 3, attn.num_heads, attn.head_dim).unbind(2)
        y = flash_attn_with_kvcache(q, cache.k[layer], cache.v[layer], k, v, cache_seqlens=cache.seqlens,
                                    block_table=cache.block_table, causal=True)
        x = x + attn.out(y.reshape(batch, n, -1))
        x = x + block.mlp(block.norm2(x))
    return model.norm(x) @ model.tokens.weight.T


@torch.no_grad()
def generate(model: CausalTransformer, prompt: torch.Tensor, steps: int, cache: PagedKVCache, step=decode_step):
    """Greedy decoding: the prompt in one step, then one token a step. ``step`` may be a compiled
    `decode_step` (``torch.compile(decode_step, fullgraph=True)``). Returns ``(batch, prompt + steps)``."""
    tokens = prompt
    logits = step(model, prompt, cache)
    cache.seqlens.add_(prompt.shape[1])
    for _ in range(steps):
        new = logits[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, new], dim=1)
        logits = step(model, new, cache)
        cache.seqlens.add_(1)
    return tokens
