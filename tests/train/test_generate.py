"""Greedy generation through flash_attn_with_kvcache against a paged cache (flashlab.train.generate),
token by token against the same model's full forward on SDPA, eager and compiled (fullgraph)."""

import pytest
import torch

from flashlab.train.generate import PagedKVCache, decode_step, generate
from flashlab.train.model import CausalTransformer


def _model(attention):
    torch.manual_seed(0)
    return CausalTransformer(vocab_size=61, max_len=64, d_model=32, n_layers=2, n_heads=4, attention=attention).eval()


def _sdpa_greedy(model, prompt, steps):
    tokens = prompt
    with torch.no_grad():
        for _ in range(steps):
            tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


@pytest.mark.parametrize("compiled", [False, True])
def test_generation_with_a_paged_cache_matches_sdpa_token_by_token(compiled):
    model = _model("sdpa")
    prompt = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    want = _sdpa_greedy(model, prompt, 12)
    cache = PagedKVCache.empty(model, batch=2, capacity=40, page_size=8)
    if compiled:
        torch._dynamo.reset()
    step = torch.compile(decode_step, backend="aot_eager", fullgraph=True) if compiled else decode_step
    got = generate(model, prompt, 12, cache, step=step)
    assert torch.equal(got, want)
    assert cache.seqlens.tolist() == [19, 19]
    # the cache's logits equal the full forward's at the last position
    with torch.no_grad():
        full = model(got)[:, -1]
        probe = PagedKVCache.empty(model, batch=2, capacity=40, page_size=8, seed=3)
        last = decode_step(model, got, probe)[:, -1]
    assert (last - full).abs().max() < 1e-4


def test_a_rotary_model_is_refused_in_one_line():
    torch.manual_seed(0)
    model = CausalTransformer(vocab_size=61, max_len=64, d_model=32, n_layers=1, n_heads=4, positions="rotary")
    cache = PagedKVCache.empty(model, batch=1, capacity=16)
    with pytest.raises(NotImplementedError, match="^model: decode_step supports learned positions only"):
        decode_step(model, torch.zeros(1, 3, dtype=torch.long), cache)
