"""flashlab attention inside Hugging Face transformers models (flashlab.integrations.transformers):
tiny Llama (GQA) and GPT-2 models built here from configs (nothing downloaded), padded on the
left and on the right. The same weights run with transformers' "sdpa" and with flashlab's
registered attention: logits on real tokens, every parameter's gradient, and greedy
generate() with a KV cache must agree."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from flashlab.integrations.transformers import NAME, register  # noqa: E402

TOL = 2e-5           # fp32 on CPU: both paths are exact fp32, they differ in summation order


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _llama():
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(config)


def _gpt2():
    config = transformers.GPT2Config(vocab_size=97, n_embd=64, n_layer=1, n_head=4, n_positions=64,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.GPT2LMHeadModel(config)


def _batch(side: str, generator):
    """Two sequences of lengths 9 and 5, padded to 9 on ``side``."""
    ids = torch.randint(3, 97, (2, 9), generator=generator)
    mask = torch.ones(2, 9, dtype=torch.long)
    if side == "left":
        mask[1, :4] = 0
    else:
        mask[1, 5:] = 0
    ids[mask == 0] = 0
    return ids, mask


def _run(model, implementation, ids, mask):
    model.set_attn_implementation(implementation)
    model.zero_grad()
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)          # real tokens count from 0 either side
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    real = mask.bool()
    loss = torch.nn.functional.cross_entropy(logits[:, :-1][real[:, 1:] & real[:, :-1]],
                                             ids[:, 1:][real[:, 1:] & real[:, :-1]])
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logits.detach()[real], grads


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama-gqa", "gpt2"])
def test_logits_and_gradients_match_sdpa(build, side):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = build().eval()
    ids, mask = _batch(side, generator)
    want_logits, want_grads = _run(model, "sdpa", ids, mask)
    got_logits, got_grads = _run(model, register(), ids, mask)
    assert model.config._attn_implementation == NAME
    print(f"logits {_rel(got_logits, want_logits):.1e}", end=" ")
    assert _rel(got_logits, want_logits) < TOL
    assert got_grads.keys() == want_grads.keys() and len(got_grads) > 10
    worst = max(_rel(got_grads[n], want_grads[n]) for n in want_grads)
    print(f"worst gradient {worst:.1e}")
    assert worst < 10 * TOL, worst


def _gemma2():
    """Gemma 2 caps its attention logits (attn_logit_softcapping: 50·tanh(x/50) in the real model; a small
    cap here so that it bends these scores) and alternates sliding-window and global layers."""
    config = transformers.Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       max_position_embeddings=64, sliding_window=4, attn_logit_softcapping=1.5,
                                       query_pre_attn_scalar=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Gemma2ForCausalLM(config)


@pytest.mark.parametrize("side", ["left", "right"])
def test_gemma2_soft_capping_matches_eager(side):
    """Logit soft-capping reaches the kernels (it was refused before): a tiny Gemma 2 gives eager's logits
    and gradients, padded either side, and eager's greedy tokens (left-padded, as generation needs). The cap
    is small enough to matter: the same model without it gives other logits."""
    torch.manual_seed(0)
    model = _gemma2().eval()
    with torch.no_grad():                     # scores of a trained model's size, not an initialised one's
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    ids, mask = _batch(side, torch.Generator().manual_seed(4))
    want_logits, want_grads = _run(model, "eager", ids, mask)
    got_logits, got_grads = _run(model, register(), ids, mask)
    print(f"logits {_rel(got_logits, want_logits):.1e}", end=" ")
    assert _rel(got_logits, want_logits) < TOL
    worst = max(_rel(got_grads[n], want_grads[n]) for n in want_grads)
    print(f"worst gradient {worst:.1e}")
    assert worst < 10 * TOL, worst
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    uncapped, _ = _run(model, "eager", ids, mask)
    assert _rel(uncapped, want_logits) > 100 * TOL, "the cap must change these logits for the test to mean anything"
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = 1.5
    if side == "right":
        return                                   # generation continues after the last token: left padding only
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0)
    model.set_attn_implementation("eager")
    want = model.generate(ids, **kwargs)
    model.set_attn_implementation(register())
    assert torch.equal(model.generate(ids, **kwargs), want)


def test_padding_reaches_the_attention():
    """Without its mask function a custom attention would get attention_mask=None and attend to
    padding: the padded sequence must give the same logits as that sequence alone."""
    torch.manual_seed(0)
    model = _llama().eval()
    model.set_attn_implementation(register())
    ids, mask = _batch("left", torch.Generator().manual_seed(2))
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0)).logits
        alone = model(input_ids=ids[1:, 4:]).logits
    assert _rel(padded[1, 4:], alone[0]) < TOL


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama-gqa", "gpt2"])
def test_generate_with_a_kv_cache_gives_the_same_tokens(build):
    torch.manual_seed(0)
    model = build().eval()
    ids, mask = _batch("left", torch.Generator().manual_seed(3))
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0)
    model.set_attn_implementation("sdpa")
    want = model.generate(ids, **kwargs)
    model.set_attn_implementation(register())
    got = model.generate(ids, **kwargs)
    assert got.shape == (2, 13)
    assert torch.equal(got, want)


def test_dropout_in_training_mode_reaches_the_kernel():
    """A model in training mode passes its attention dropout: outputs change with the seed and
    the same seed reproduces them."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, attention_dropout=0.5)
    model = transformers.LlamaForCausalLM(config).train()
    model.set_attn_implementation(register())
    ids = torch.randint(3, 97, (1, 9))
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append(model(input_ids=ids).logits.detach())
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_names_with_flash_are_refused():
    with pytest.raises(ValueError, match="flash"):
        register("my_flashlab")


@pytest.mark.parametrize("name", ["sdpa", "eager", "flex_attention", "paged|eager", "", "  "])
def test_transformers_own_names_are_refused(name):
    """register("sdpa") replaced transformers' SDPA for every model of the process (a practitioner's
    trial: a model loaded with attn_implementation="sdpa" then ran interpreted, 0.0017 s → 0.13 s a
    forward); "eager" and "" were taken too. Registering flashlab's own name again is fine."""
    from transformers import AttentionInterface
    before = dict(AttentionInterface._global_mapping)
    with pytest.raises(ValueError, match=r"^name: .*(transformers' own|not a name)"):
        register(name)
    assert AttentionInterface._global_mapping == before
    assert register() == register() == "lab_attention"


def test_what_the_kernels_do_not_have_is_refused_not_dropped():
    """Attention sinks (gpt-oss passes s_aux, a learned logit per head in every row's softmax) were
    silently dropped: logits off by 0.3-0.6 from eager on a tiny gpt-oss (a practitioner's trial).
    Now, like attention weights, they raise one clear error naming the argument."""
    from flashlab.integrations.transformers import attention_forward
    q, k, v = (torch.randn(1, 4, 6, 16) for _ in range(3))
    module = torch.nn.Module()
    for kwargs, argument in ((dict(s_aux=torch.zeros(4)), "s_aux"),
                             (dict(output_attentions=True), "output_attentions")):
        with pytest.raises(ValueError, match=f"^{argument}: "):
            attention_forward(module, q, k, v, None, **kwargs)
    out, weights = attention_forward(module, q, k, v, None, s_aux=None)
    assert out.shape == (1, 6, 4, 16) and weights is None


def test_a_model_that_would_not_use_the_attention_is_refused_in_one_line(monkeypatch):
    """BERT on transformers 4.56 computes attention in its own classes and failed with a bare
    KeyError: 'lab_attention'; DeBERTa on 5.x keeps its own attention without a word. attach() and
    register(model=...) check transformers' _supports_attention_backend and refuse such a model in one
    line; a model that supports it (BERT on this transformers, if so) runs flashlab's attention, padded."""
    from flashlab.integrations.transformers import attach, supports
    deberta = transformers.DebertaModel(transformers.DebertaConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    assert not supports(deberta) and not supports(transformers.DebertaModel)
    for call in (lambda: attach(deberta), lambda: register(model=transformers.DebertaModel)):
        with pytest.raises(ValueError, match=r"^model: DebertaModel on transformers .* not through AttentionInterface"):
            call()
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).eval()
    if not supports(bert):                       # transformers 4.56: the clear error is the contract
        with pytest.raises(ValueError, match="^model: BertModel"):
            attach(bert)
        return
    ids = torch.randint(0, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    import flashlab.integrations.transformers as integration
    calls, original = [], integration.attention
    monkeypatch.setattr(integration, "attention", lambda *a, **k: calls.append(1) or original(*a, **k))
    with torch.no_grad():
        want = bert(ids, attention_mask=mask).last_hidden_state
        got = attach(bert)(ids, attention_mask=mask).last_hidden_state
    assert bert.config._attn_implementation == NAME and len(calls) == 1      # one layer: flashlab's attention ran
    assert _rel(got[0], want[0]) < TOL and _rel(got[1, :6], want[1, :6]) < TOL
