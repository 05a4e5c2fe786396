"""flashlab.attention (flashlab/api/attention.py, Triton kernels): forward and gradients against float64.

On a CPU the kernels run in Triton's interpreter at small sizes; on a GPU the same tests
run compiled, plus bf16 and long sequences (marked `gpu`)."""

import pytest
import torch
import torch.nn.functional as F

from flashlab import assert_close, naive_attention, reference_attention, reference_gradients
from flashlab.api import attention as flash_attention
from flashlab.api.attention import MultiHeadAttention, attention
from flashlab.launch import autotune
from flashlab.launch.dense import draw_dropout_seed, dropout_keep_mask
from flashlab.reference.naive import causal_keep_mask

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu = pytest.mark.gpu
# fp32 runs with exact products (exact_fp32=True): fp32 rounding only
# bf16: correct kernels measured 2.4e-3 on an H200; a wrong dK tile measured 1.2e-2
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 8e-3}


@pytest.fixture(autouse=True)
def _default_configs(monkeypatch):
    """Compiled tests run each kernel's default configuration: tuning every shape of this file
    would compile every candidate for each. The candidates are checked one by one below, and
    the tuner itself in two tests of its own."""
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", "0")


def _check(B, H, H_kv, Nq, Nk, D, is_causal, dtype, attn_mask=None, q_layout="bhnd", dropout_p=0.0, window=None,
           softcap=None):
    make = lambda h, n: torch.randn(B, h, n, D, device=DEVICE, dtype=dtype)  # noqa: E731
    if q_layout == "bnhd":  # a (B, N, H, D) tensor seen as (B, H, N, D): strided, no copy
        q = torch.randn(B, Nq, H, D, device=DEVICE, dtype=dtype).transpose(1, 2).requires_grad_()
    else:
        q = make(H, Nq).requires_grad_()
    k, v = make(H_kv, Nk).requires_grad_(), make(H_kv, Nk).requires_grad_()
    rng = torch.random.get_rng_state()
    out = attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=H != H_kv,
                    exact_fp32=True, window=window, softcap=softcap)
    keep = None
    if dropout_p:  # replay the seed the call drew and ask the kernels for the mask Z they used
        torch.random.set_rng_state(rng)
        keep = dropout_keep_mask(draw_dropout_seed(), B, H, Nq, Nk, dropout_p, device=DEVICE)
    drop = dict(dropout_p=dropout_p, dropout_keep=keep, window=window, softcap=softcap)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    group = H // H_kv
    k_full, v_full = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    assert_close(out, reference_attention(q, k_full, v_full, attn_mask, is_causal, **drop), tol=TOL[dtype])
    dq, dk, dv = reference_gradients(q, k_full, v_full, grad_out, attn_mask, is_causal, **drop)
    dk = dk.view(B, H_kv, group, Nk, D).sum(2)   # a shared k/v head collects every q head's gradient
    dv = dv.view(B, H_kv, group, Nk, D).sum(2)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), (dq, dk, dv)):
        assert torch.isfinite(got).all(), f"d{name} has NaN/inf"
        assert_close(got, want, tol=TOL[dtype], what=f"d{name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", [(1, 1, 16), (17, 17, 16), (100, 100, 80), (257, 100, 16), (40, 257, 128)])
def test_matches_reference(Nq, Nk, D, is_causal, dtype):
    _check(1, 2, 2, Nq, Nk, D, is_causal, dtype)


@pytest.mark.parametrize("H,H_kv", [(4, 2), (4, 1)])
def test_grouped_and_multi_query(H, H_kv):
    _check(2, H, H_kv, 33, 50, 16, True, torch.float32)


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 40), (2, 2, 30, 40), (30, 40)])
def test_boolean_masks(mask_shape):
    keep = torch.rand(mask_shape, device=DEVICE) > 0.4
    _check(2, 2, 2, 30, 40, 16, False, torch.float32, attn_mask=keep)


# Soft-capping through the dense kernels (past the small path's 128 keys): alone, causal and ragged, with
# a float mask added after the cap, GQA, a window, and dropout; a cap small enough to bend every score
@pytest.mark.parametrize("Nq,Nk,D,is_causal,extra", [
    (150, 150, 16, True, {}),
    (130, 200, 32, False, {"attn_mask": "float"}),
    (150, 150, 16, True, {"H_kv": 1}),
    (160, 160, 16, True, {"window": (40, 0)}),
    (140, 140, 16, False, {"dropout_p": 0.2}),
])
def test_soft_capping_in_the_dense_kernels(Nq, Nk, D, is_causal, extra):
    extra = dict(extra)
    H_kv = extra.pop("H_kv", 2)
    if extra.get("attn_mask") == "float":
        extra["attn_mask"] = torch.randn(1, 2, Nq, Nk, device=DEVICE)
    _check(1, 2, H_kv, Nq, Nk, D, is_causal, torch.float32, softcap=0.7, **extra)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Nq,Nk,D", [(1000, 1000, 64), (40, 257, 128), (1000, 1000, 128)])
def test_soft_capping_in_half_precision_on_gpu(Nq, Nk, D, dtype):
    _check(2, 4, 2, Nq, Nk, D, True, dtype, softcap=20.0)


def test_float_mask_and_fully_masked_rows():
    _check(2, 2, 2, 30, 40, 16, False, torch.float32, attn_mask=torch.randn(2, 1, 30, 40, device=DEVICE))
    keep = torch.rand(1, 2, 30, 40, device=DEVICE) > 0.5
    keep[..., 5, :] = False                        # query 5 sees nothing: output and grads 0
    _check(1, 2, 2, 30, 40, 16, False, torch.float32, attn_mask=keep)


def test_strided_input_and_scale():
    _check(2, 3, 3, 37, 37, 32, True, torch.float32, q_layout="bnhd")
    q, k, v = (torch.randn(1, 2, 20, 16, device=DEVICE) for _ in range(3))
    assert_close(attention(q, k, v, scale=0.3, exact_fp32=True), reference_attention(q, k, v, scale=0.3),
                 tol=1e-5)


def test_causal_tiles_past_the_diagonal_are_never_read():
    """40 queries, 400 keys, causal: keys ≥ 40 are masked for every query. Key and value
    rows from 256 on hold NaN; a kernel that loaded those tiles (and masked afterwards)
    would return NaN, since 0 · NaN = NaN in P V and in the backward's dO Vᵀ."""
    q, grad_out = (torch.randn(1, 2, 40, 32, device=DEVICE) for _ in range(2))
    k, v = (torch.randn(1, 2, 400, 32, device=DEVICE) for _ in range(2))
    k[:, :, 256:], v[:, :, 256:] = float("nan"), float("nan")
    k.requires_grad_(), v.requires_grad_(), q.requires_grad_()
    out = attention(q, k, v, is_causal=True, exact_fp32=True)
    out.backward(grad_out)
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()
    assert (k.grad[:, :, 40:] == 0).all() and (v.grad[:, :, 40:] == 0).all()
    assert_close(out, reference_attention(q, k[:, :, :40], v[:, :, :40], is_causal=True), tol=1e-5)


@pytest.mark.parametrize("n", [70, 150])     # the small path (≤ 128 keys) and the tiled kernels of notebook 06
def test_deterministic(n):
    """Two backward passes give the same bits: no two programs write one output tile (no atomics). In
    the CPU's interpreter the programs run one at a time, so only a GPU run tests that design."""
    q, k, v = (torch.randn(1, 2, n, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    runs = []
    for _ in range(2):
        out = attention(q, k, v, is_causal=True)
        runs.append((out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("Nq,Nk,is_causal", [(17, 17, False), (100, 70, True), (1, 33, False)])
def test_dropout_matches_reference_with_the_kernels_mask(Nq, Nk, is_causal, dtype):
    """O = (P ∘ Z/(1−p)) V and its gradients, with Z the mask the kernels regenerate."""
    _check(2, 2, 2, Nq, Nk, 16, is_causal, dtype, dropout_p=0.3)


def test_dropout_with_gqa_and_mask():
    keep = torch.rand(2, 1, 1, 45, device=DEVICE) > 0.3
    _check(2, 4, 2, 30, 45, 32, False, torch.float32, attn_mask=keep, dropout_p=0.2)


@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
def test_dropout_keep_rate_and_independence(dropout_p):
    B, H, Nq, Nk = 2, 3, 70, 90
    keep = dropout_keep_mask(draw_dropout_seed(), B, H, Nq, Nk, dropout_p, device=DEVICE).float()
    n = keep.numel()
    sigma = (dropout_p * (1 - dropout_p) / n) ** 0.5
    # keep rate 1 − p within 5 standard errors (a false alarm about once in 3.5 million runs)
    assert abs(keep.mean().item() - (1 - dropout_p)) < 5 * sigma, keep.mean().item()
    per_head = keep.mean(dim=(2, 3)).flatten()
    assert (per_head - (1 - dropout_p)).abs().max() < 5 * sigma * (B * H) ** 0.5   # every head, too
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])  # own streams
    # neighbouring entries are uncorrelated: agreement of Z with its right neighbour ≈ p² + (1−p)²
    agree = (keep[..., 1:] == keep[..., :-1]).float().mean().item()
    assert abs(agree - (dropout_p**2 + (1 - dropout_p) ** 2)) < 0.02


def test_dropout_reproducible_from_torch_seed():
    q, k, v = (torch.randn(1, 2, 40, 16, device=DEVICE) for _ in range(3))
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append(attention(q, k, v, dropout_p=0.25))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_module_drops_only_in_training():
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 2, dropout=0.5).to(DEVICE)
    x = torch.randn(1, 20, 32, device=DEVICE)
    assert not torch.equal(layer(x), layer(x))          # training: a new mask per call
    layer.eval()
    assert torch.equal(layer(x), layer(x))


@pytest.mark.parametrize("args,kwargs,message", [
    ((32, 0), {}, r"^num_heads: expected a positive integer, got 0"),
    ((32, 2.0), {}, r"^num_heads: expected a positive integer, got 2.0"),
    ((0, 2), {}, r"^embed_dim: expected a positive integer"),
    ((32, 5), {}, r"^num_heads: 5 does not divide embed_dim=32. Pick a divisor"),
    ((32, 4), {"dropout": 1.5}, r"^dropout: 1.5 is not a probability in \[0, 1\]"),
    ((32, 4), {"dropout": -0.1}, r"^dropout: -0.1 is not a probability"),
])
def test_module_refuses_bad_settings_naming_them(args, kwargs, message):
    """A practitioner's trial: num_heads=0 raised ZeroDivisionError, and dropout=1.5 was taken (the error
    came at the first training call, naming dropout_p)."""
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(*args, **kwargs)


@pytest.mark.parametrize("shape,message", [((7, 32), r"got shape \(7, 32\). Add a batch dimension: x.unsqueeze\(0\)"),
                                           ((2, 7, 16), r"got shape \(2, 7, 16\). Give 32 features per token"),
                                           ((1, 2, 7, 32), r"got shape \(1, 2, 7, 32\)")])
def test_module_names_a_bad_input_shape(shape, message):
    """It used to fail inside the projection (mat1 and mat2 shapes cannot be multiplied) or in an
    unpacking (not enough values to unpack)."""
    with pytest.raises(ValueError, match=r"^x: expected \(batch, N, embed_dim=32\), " + message):
        MultiHeadAttention(32, 4)(torch.randn(*shape))


def test_drop_in_for_sdpa_in_a_module():
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, 4, causal=True).to(DEVICE)
    x = torch.randn(2, 33, 64, device=DEVICE)
    reference = MultiHeadAttention(64, 4, causal=True, attention_fn=F.scaled_dot_product_attention).to(DEVICE)
    reference.load_state_dict(layer.state_dict())
    assert_close(layer(x), reference(x).double(), tol=1e-3 if CUDA else 1e-5)


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_a_causal_module_given_a_padding_mask_stays_causal(mask_kind):
    """A practitioner's trial: MultiHeadAttention(causal=True) passed is_causal only without a mask,
    so a padding mask turned a decoder layer bidirectional (position 0 then saw the last token)."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 4, causal=True).to(DEVICE).eval()
    reference = MultiHeadAttention(32, 4, attention_fn=F.scaled_dot_product_attention).to(DEVICE).eval()
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(2, 10, 32, device=DEVICE)
    keep = torch.ones(2, 1, 1, 10, dtype=torch.bool, device=DEVICE)
    keep[1, ..., 7:] = False                                   # the second sequence is 7 tokens long
    mask = keep if mask_kind == "bool" else torch.zeros(keep.shape, device=DEVICE).masked_fill(~keep, -1e9)
    causal = causal_keep_mask(10, 10, DEVICE)
    want = reference(x, attn_mask=keep & causal)      # both masks, spelt out, through SDPA
    assert_close(layer(x, attn_mask=mask), want.double(), tol=1e-3 if CUDA else 1e-5)
    nothing_masked = torch.ones_like(keep)
    later = x.clone()
    later[:, -1] += 10                                          # a later token cannot move an earlier output
    assert torch.allclose(layer(later, attn_mask=nothing_masked)[:, :-1], layer(x, attn_mask=nothing_masked)[:, :-1],
                          atol=1e-5)


@pytest.mark.parametrize("kwargs,argument", [
    ({"dropout_p": 1.5}, "dropout_p"),
    ({"dropout_p": -0.1}, "dropout_p"),
    ({"k": torch.randn(1, 3, 8, 16)}, "key"),                       # heads differ without GQA
    ({"k": torch.randn(1, 2, 8, 8)}, "key"),                        # q·k head dims differ
    ({"attn_mask": torch.ones(3, 9, dtype=torch.bool)}, "attn_mask"),
    ({"v": torch.randn(1, 2, 9, 16)}, "value"),                     # one value row per key
    ({"q": torch.randn(2, 2, 8, 16), "k": torch.randn(3, 2, 8, 16), "v": torch.randn(3, 2, 8, 16)},
     "key"),                                                        # batch 3 vs q's 2: no broadcast
    ({"scale": float("nan")}, "scale"),                            # any finite scale is SDPA's (0 too)
    ({"scale": "0.5"}, "scale"),
    ({"window": (-2, 0)}, "window"),
    ({"window": (4,)}, "window"),
    ({"window": (1.5, 0)}, "window"),
    ({"window": (True, 0)}, "window"),
    ({"window": 8}, "window"),
    ({"softcap": -1.0}, "softcap"),
    ({"softcap": float("inf")}, "softcap"),
    ({"softcap": "30"}, "softcap"),
])
# (3-D inputs, D > 256 and Dv ≠ D are accepted now, as SDPA accepts them: tests/api/test_dropin.py)
def test_clear_errors(kwargs, argument):
    args = {"q": torch.randn(1, 2, 8, 16), "k": torch.randn(1, 2, 8, 16), "v": torch.randn(1, 2, 8, 16)}
    args.update(kwargs)
    args = {name: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for name, t in args.items()}
    with pytest.raises(ValueError, match=rf"^{argument}:"):     # errors name SDPA's parameters: query, key, value
        attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


@pytest.mark.parametrize("heads_q,heads_kv,enable_gqa,message", [
    (6, 4, True, r"^key: 4 heads do not divide query's 6\. .* divides 6 \(1, 2, 3, 6\)\.$"),
    (8, 2, False, r"^key: has 2 heads, query 8\. For grouped-query attention pass enable_gqa=True .* 4 query heads"),
    (6, 4, False, r"^key: has 4 heads, query 6\. .*same number of heads \(or one, which broadcasts; or, with "
                  r"enable_gqa=True, .*1, 2, 3, 6\)"),
])
def test_a_head_count_mismatch_says_which_counts_would_do(heads_q, heads_kv, enable_gqa, message):
    """Heads that do not divide (enable_gqa=True) were reported as differing 'leading (batch, head)
    dimensions', the same words as a batch mismatch (a practitioner's trial): now the counts, what
    divides, and enable_gqa where it is the fix. Functions without enable_gqa do not suggest it."""
    q = torch.randn(1, heads_q, 5, 8)
    k = v = torch.randn(1, heads_kv, 5, 8)
    with pytest.raises(ValueError, match=message):
        attention(q, k, v, enable_gqa=enable_gqa)
    with pytest.raises(ValueError, match=r"^k: has \d heads, q \d\. q, k and v must have the same number of heads\.$"):
        naive_attention(q, k, v)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", [(1000, 1000, 64), (1000, 1000, 96), (40, 257, 128), (1000, 1000, 128),
                                     (257, 100, 256), (1, 17, 128)])
def test_half_precision_on_gpu(Nq, Nk, D, is_causal, dtype):
    _check(2, 4, 4, Nq, Nk, D, is_causal, dtype)


@gpu
@pytest.mark.parametrize("N", [4096, 16384])
def test_long_sequences_on_gpu(N):
    _check(1, 2, 2, N, N, 64, True, torch.bfloat16)


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16), (16, 16)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", [(100, 70, 24), (96, 96, 16)])
def test_backward_fast_path_with_any_tiles(block_m, block_n, is_causal, Nq, Nk, D):
    """The backward's unmasked tiles (whole blocks, below the diagonal) and its checked tiles
    (the diagonal, ragged Nq and Nk, head dims that are not powers of two) must meet
    exactly, for any block shapes: gradients vs float64 with GQA."""
    config = autotune.Config(block_m, block_n, 4, 1)
    with autotune.force(forward=config, dkdv=config, dq=config):
        _check(1, 4, 2, Nq, Nk, D, is_causal, torch.float32)


@pytest.mark.parametrize("is_causal", [False, True])
def test_backward_with_every_tile_checked(is_causal):
    """dK/dV with the fast path compiled out (Config.fast_path=False, a tuning candidate): the
    checked path alone must cover every tile, ragged and diagonal ones included."""
    config = autotune.Config(16, 16, 4, 1, fast_path=False)
    with autotune.force(dkdv=config):
        _check(1, 4, 2, 100, 70, 24, is_causal, torch.float32)


def _every_candidate():
    if not CUDA:
        return []
    capability = torch.cuda.get_device_capability()
    return [(kernel, d, config) for kernel in autotune.KERNELS for d in (16, 64, 128, 256)
            for config in dict.fromkeys(autotune.candidates(kernel, d, capability))]


@gpu
@pytest.mark.parametrize("kernel,D,config", _every_candidate(), ids=str)
def test_every_autotuning_candidate_on_gpu(kernel, D, config):
    """Whatever the tuner picks must be right: each candidate configuration of each kernel,
    forced, on ragged N (not a block multiple), causal and not, bf16, vs float64."""
    import triton
    with autotune.force(**{kernel: config}):
        try:
            for is_causal in (False, True):
                _check(1, 4, 2, 1000, 1000, D, is_causal, torch.bfloat16)
        except triton.runtime.errors.OutOfResources as exc:   # the tuner skips these too
            pytest.skip(f"{config} does not fit at D={D}: {exc}")


@gpu
def test_autotuned_attention_on_gpu(monkeypatch):
    """End to end with tuning on: the first call times the candidates and records its choice;
    the result is right either way."""
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", "1")
    monkeypatch.setenv("FLASHLAB_HOPPER", "0")   # the general kernels (an H100/H200 would take the Hopper path)
    monkeypatch.setattr(autotune.tuner, "cache_path", "")   # tune now, even if an earlier run stored choices
    before = len(autotune.tuner.report())
    _check(2, 4, 4, 1000, 1000, 64, True, torch.bfloat16)
    chosen = {entry["key"][0] for entry in autotune.tuner.report()[before:]}
    assert chosen == {"forward", "dkdv", "dq"}


@pytest.mark.filterwarnings("ignore:flashlab. tuning the attention kernels:RuntimeWarning")   # its fake GPU
def test_autotuner_picks_the_fastest_and_rejects_wrong_configs(monkeypatch, tmp_path):
    """On fake timings: the fastest agreeing config wins and is remembered per key; a config
    whose outputs disagree with the default's, or that fails to compile, is never chosen."""
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", "1")
    a, b, c, d, e = (autotune.Config(m, 32, 4, 1) for m in (16, 32, 64, 128, 256))
    fake_ms = {a: 3.0, b: 2.0, c: 1.0, d: 0.5, e: 2.95}
    result = torch.randn(50)
    calls = []

    def launch(config):
        calls.append(config)
        if config == d:
            raise RuntimeError("out of resources: shared memory")
        return (result * (1.5 if config == c else 1.0),)   # c is fast but wrong

    tuner = autotune.Autotuner(bench=lambda fn: (fn(), fake_ms[calls[-1]])[1], cache_path=str(tmp_path / "tune.json"))
    key = ("forward", "cuda:0", "torch.bfloat16", 64, True, False, False, 1, 1024, 1024, 64)
    assert tuner.choose(key, [a, b, c, d], launch) == b
    assert set(tuner.report()[0]["rejected"]) == {str(c), str(d)}
    calls.clear()
    assert tuner.choose(key, [a, b, c, d], launch) == b and calls == []     # remembered, not re-timed
    assert tuner.choose(key[:-1] + (128,), [a, e], launch) == a     # 1.7% faster is noise: keep the default
    # a new process (a new tuner on the same file) reuses the decisions without running anything
    calls.clear()
    again = autotune.Autotuner(bench=lambda fn: 1 / 0, cache_path=str(tmp_path / "tune.json"))
    assert again.choose(key, [a, b, c, d], launch) == b and calls == []
    assert again.report()[0]["from_cache"] == str(tmp_path / "tune.json")
    third = autotune.Autotuner(bench=lambda fn: (fn(), fake_ms[calls[-1]])[1], cache_path=str(tmp_path / "tune.json"))
    assert third.choose(key, [a, c, d], launch) == a and calls        # b no longer a candidate: re-tuned
    assert autotune.Autotuner(cache_path="")._stored(key, [a, b]) is None  # "" keeps nothing on disk
    assert autotune.shape_key("dq", torch.empty(2, 8, 1000, 64), torch.empty(2, 2, 1000, 64), True, False, False) \
        == ("dq", torch.device("cpu"), torch.float32, 64, True, False, False, 4, 1024, 1024, 16)
    # a window is remembered apart (its work per program differs); keys without one are unchanged,
    # so the decisions shipped for them still apply
    assert autotune.shape_key("dq", torch.empty(2, 8, 1000, 64), torch.empty(2, 2, 1000, 64), True, False, False,
                              window=True)[-1] == "window"


def test_candidate_lists():
    """One small config under the interpreter; Hopper lists start with the previously
    hand-picked defaults and never pipeline dK/dV with BLOCK_M < BLOCK_N (wrong dK on an H200)."""
    for kernel in autotune.KERNELS:
        assert autotune.candidates(kernel, 64, None) == [autotune.INTERPRETER]
        for d in (16, 64, 96, 128, 256):
            for capability in ((9, 0), (8, 0), (8, 9)):
                configs = autotune.candidates(kernel, d, capability)
                assert configs and len(set(configs)) == len(configs)
    assert autotune.candidates("forward", 64, (9, 0))[0] == autotune.Config(128, 64, 4, 3)
    assert autotune.candidates("forward", 128, (9, 0))[0] == autotune.Config(128, 64, 8, 3)
    for kernel in autotune.KERNELS:   # D ≤ 32 has lists of its own, whose default is D = 64's
        assert autotune.candidates(kernel, 16, (9, 0)) == autotune.candidates(kernel, 32, (9, 0))
        assert autotune.candidates(kernel, 16, (9, 0)) != autotune.candidates(kernel, 64, (9, 0))
        assert autotune.candidates(kernel, 16, (9, 0))[0] == autotune.candidates(kernel, 64, (9, 0))[0]
    for d in (16, 128):
        for capability in ((9, 0), (8, 0)):
            assert all(c.block_m >= c.block_n for c in autotune.candidates("dkdv", d, capability) if c.num_stages > 1)
    with pytest.raises(ValueError, match="kernel"):
        autotune.candidates("backward", 64, (9, 0))
    with pytest.raises(ValueError, match="unknown kernels"):
        with autotune.force(backward=autotune.INTERPRETER):
            pass


@gpu
@pytest.mark.parametrize("is_causal", [False, True])
def test_more_than_65535_batch_heads_on_gpu(is_causal):
    """B·H = 65536 (8192 TSP instances × 8 heads): more programs than CUDA allows in grid
    dimensions 1 and 2, so the kernels index (block, batch·head) in dimension 0."""
    _check(8192, 8, 8, 20, 20, 16, is_causal, torch.bfloat16)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Nq,Nk,D,is_causal", [(1000, 1000, 64, True), (257, 1000, 128, False),
                                               (4096, 4096, 128, True)])
def test_dropout_on_gpu(Nq, Nk, D, is_causal, dtype):
    _check(1, 2, 2, Nq, Nk, D, is_causal, dtype, dropout_p=0.1)


@pytest.mark.parametrize("n_q,n_k,block_m,block_n", [(256, 256, 64, 32), (128, 512, 128, 64), (100, 70, 32, 32),
                                                     (1, 1, 32, 32), (300, 200, 64, 64)])
def test_causal_tile_plan_skips_only_useless_tiles(n_q, n_k, block_m, block_n):
    """Every tile holding an entry with key j ≤ query i (inside Nq × Nk) is computed; a tile
    marked FULL has no masked entry; when Nq is a block multiple, nothing useless is computed."""
    from flashlab.kernels.dense import FULL, SKIPPED, causal_tile_plan
    plan = causal_tile_plan(n_q, n_k, block_m, block_n)
    for bm, row in enumerate(plan):
        queries = range(bm * block_m, min((bm + 1) * block_m, n_q))
        for bn, kind in enumerate(row):
            keys = range(bn * block_n, min((bn + 1) * block_n, n_k))
            needed = any(j <= i for i in queries for j in keys)
            if needed:
                assert kind != SKIPPED, (bm, bn)
            elif n_q % block_m == 0:
                assert kind == SKIPPED, (bm, bn)
            if kind == FULL:
                assert len(keys) == block_n and all(j <= i for i in queries for j in keys), (bm, bn)


def test_no_grad_path_matches_the_autograd_path():
    """Under no_grad (or with inputs that need no gradient) attention skips autograd's
    Function: same output bit for bit, no graph."""
    q, k, v = (torch.randn(2, 4, 40, 32, device=DEVICE) for _ in range(3))
    with_graph = attention(*(t.clone().requires_grad_() for t in (q, k, v)), is_causal=True)
    with torch.no_grad():
        without = attention(q, k, v, is_causal=True)
    plain = attention(q, k, v, is_causal=True)
    assert with_graph.grad_fn is not None and without.grad_fn is None and plain.grad_fn is None
    assert torch.equal(with_graph.detach(), without) and torch.equal(without, plain)


@pytest.mark.parametrize("route", ["small path", "general, N above the small path", "general, mask gradient",
                                   "tiled PyTorch path (float64)"])
def test_a_second_derivative_raises_instead_of_being_dropped(route):
    """With create_graph=True the first derivative is the usual one (bit for bit) and carries a
    graph; differentiating it again (a gradient penalty) raises one clear error on every eager
    route. Before, the kernels' gradients came back as constants (a penalty through attention
    silently contributed nothing) and the tiled float64 path's second derivative was wrong
    (19.96 where SDPA's math backend gives 37.06, found by a user's Hessian-vector product)."""
    n = 130 if route.startswith("general, N") else 20         # 130 > max_keys(16, fp32) = 128
    dtype = torch.float64 if "float64" in route else torch.float32
    q, k, v = (torch.randn(1, 2, n, 16, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.randn(1, 2, n, n, device=DEVICE, requires_grad=True) if "mask" in route else None
    assert ("float64" in route) == (not flash_attention._call_plan(q, k, v, mask, 0.0, False, None, False, False,
                                                                   None, None).kernels)
    plain = torch.autograd.grad(attention(q, k, v, attn_mask=mask).square().sum(), (q, k, v))
    first = torch.autograd.grad(attention(q, k, v, attn_mask=mask).square().sum(), (q, k, v), create_graph=True)
    for got, want in zip(first, plain):
        assert torch.equal(got.detach(), want) and got.grad_fn is not None
    penalty = sum(g.square().sum() for g in first)
    with pytest.raises(RuntimeError, match="flashlab's attention has no second derivative"):
        penalty.backward()


# (Nq, Nk, is_causal, window): the band at the sequence edges, N = 1, 17 and 1000 (no block
# multiples), wider than N, one query's own key only, left = 0 with right > 0, unbounded sides,
# Nq ≠ Nk both ways (the window aligned to the end of the keys)
WINDOWS = [(1, 1, True, (0, 0)), (1, 1, False, (3, 3)), (17, 17, True, (5, 0)), (17, 17, False, (3, 3)),
           (1000, 1000, True, (40, 0)), (1000, 1000, False, (20, 20)), (100, 100, True, (500, 0)),
           (100, 100, False, (0, 7)), (37, 37, False, (0, 0)), (70, 100, False, (10, -1)), (100, 70, False, (-1, 3)),
           (40, 90, True, (30, 0))]


@pytest.mark.parametrize("Nq,Nk,is_causal,window", WINDOWS, ids=str)
def test_sliding_windows_match_reference(Nq, Nk, is_causal, window):
    """Output and gradients of windowed attention against float64 with the window as a mask."""
    _check(1, 1 if Nq >= 1000 else 2, 1, Nq, Nk, 24, is_causal, torch.float32, window=window)


def test_sliding_window_with_gqa_mask_dropout_and_half_precision():
    """A window together with GQA, a float mask (its gradient too), dropout, and fp16."""
    _check(2, 4, 2, 50, 50, 16, True, torch.float32, window=(8, 0))
    _check(1, 2, 2, 30, 40, 16, False, torch.float32, attn_mask=torch.randn(1, 1, 30, 40, device=DEVICE,
                                                                              requires_grad=True), window=(5, 5))
    _check(1, 2, 2, 60, 60, 16, True, torch.float32, dropout_p=0.2, window=(12, 0))
    _check(1, 2, 1, 45, 45, 32, True, torch.float16, window=(9, 0))


@pytest.mark.parametrize("block_m,block_n,fast_path", [(16, 32, True), (32, 16, True), (16, 16, False)])
def test_sliding_window_with_any_tiles(block_m, block_n, fast_path):
    """The window's checked edges and unchecked middle meet exactly for any block shapes, with
    the dK/dV fast path and without it."""
    config = autotune.Config(block_m, block_n, 4, 1, fast_path=fast_path)
    with autotune.force(forward=config, dkdv=config, dq=config):
        _check(1, 2, 1, 70, 70, 24, True, torch.float32, window=(21, 0))
        _check(1, 1, 1, 60, 45, 16, False, torch.float32, window=(5, 18))


def test_keys_outside_the_window_are_never_read():
    """32 queries at the end of 512 keys, window (20, 0): they see keys 460..511 only. Key and
    value rows below 384 hold NaN; a kernel that loaded those tiles (and masked afterwards)
    would return NaN. The dK/dV programs of those keys see no query: zero gradients."""
    q, grad_out = (torch.randn(1, 2, 32, 32, device=DEVICE) for _ in range(2))
    k, v = (torch.randn(1, 2, 512, 32, device=DEVICE) for _ in range(2))
    k[:, :, :384], v[:, :, :384] = float("nan"), float("nan")
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = attention(q, k, v, window=(20, 0), exact_fp32=True)
    out.backward(grad_out)
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    assert (k.grad[:, :, :460] == 0).all() and (v.grad[:, :, :460] == 0).all()
    assert_close(out, reference_attention(q, k[:, :, 448:], v[:, :, 448:], window=(20, 0)), tol=1e-5)


def test_window_rule_written_out():
    """The rule itself, independent of any implementation: query i sees keys
    i + Nk − Nq − left … i + Nk − Nq + right (aligned to the end of the keys), −1 unbounded;
    is_causal (top-left, j ≤ i) applies too."""
    from flashlab.reference.naive import window_keep_mask
    rows = lambda *r: torch.tensor(r, dtype=torch.bool)  # noqa: E731
    assert torch.equal(window_keep_mask(3, 5, False, (1, 0)), rows([0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]))
    assert torch.equal(window_keep_mask(3, 5, False, (0, -1)), rows([0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 0, 1]))
    assert torch.equal(window_keep_mask(4, 4, True, (1, 5)), rows([1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0],
                                                                 [0, 0, 1, 1]))
    assert torch.equal(window_keep_mask(2, 4, True, (3, 0)), rows([1, 0, 0, 0], [1, 1, 0, 0]))
    assert window_keep_mask(4, 4, False, None) is None and window_keep_mask(4, 4, False, (-1, -1)) is None


def test_unbounded_window_is_no_window():
    q, k, v = (torch.randn(1, 2, 40, 16, device=DEVICE) for _ in range(3))
    assert torch.equal(attention(q, k, v, is_causal=True, window=(-1, -1)), attention(q, k, v, is_causal=True))
    assert torch.equal(attention(q, k, v, window=[-1, -1]), attention(q, k, v))


def test_sliding_window_on_the_pytorch_path():
    """float64 (and calls too large for the interpreter) take the PyTorch path: same window."""
    q, k, v = (torch.randn(2, 3, 50, 8, dtype=torch.float64, device=DEVICE) for _ in range(3))
    keep = (torch.arange(50)[None, :] - torch.arange(50)[:, None]).to(DEVICE)
    keep = (keep <= 0) & (keep >= -6)                             # causal, the 6 keys before and itself
    assert_close(attention(q, k, v, is_causal=True, window=(6, 0)),
                 F.scaled_dot_product_attention(q, k, v, attn_mask=keep))
