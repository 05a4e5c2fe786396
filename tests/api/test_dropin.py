"""flashlab.attention as a drop-in for SDPA (issue 17): custom ops under torch.compile and
torch.export, any import order, nothing set at import, every input SDPA takes, and no
silently wrong result (bf16 on CPU, float-mask gradients)."""

import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import flashlab
from flashlab import assert_close
from flashlab.api import ops
from flashlab.api.attention import attention, input_precision
from flashlab.launch.layouts import output_like
from flashlab.reference.float64 import rel_error

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _run_python(code: str, env_drop=("TRITON_INTERPRET",), script=None) -> str:
    """Run ``code`` in a fresh interpreter (from the file ``script`` if given: @triton.jit
    needs its kernels' source in a file); its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    env["PYTHONPATH"] = str(ROOT)
    if script is not None:
        script.write_text(textwrap.dedent(code))
    command = [sys.executable, str(script)] if script is not None else [sys.executable, "-c", textwrap.dedent(code)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_any_import_order_and_nothing_set_at_import():
    """triton and torch._dynamo imported first (as lightning or rl4co do): flashlab's kernels
    still run on CPU tensors, and importing flashlab leaves TRITON_INTERPRET alone."""
    out = _run_python("""
        import os, triton, torch._dynamo, torch, torch.nn.functional as F
        import flashlab
        assert "TRITON_INTERPRET" not in os.environ, "import flashlab set TRITON_INTERPRET"
        q, k, v = (torch.randn(1, 2, 9, 16, dtype=torch.float64).float().requires_grad_() for _ in range(3))
        out = flashlab.attention(q, k, v, is_causal=True)
        out.sum().backward()
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        x = torch.randn(3, 20)
        print((out - ref).abs().max().item(), q.grad.abs().sum().item() > 0,
              (flashlab.fused_softmax(x) - x.softmax(-1)).abs().max().item(), "TRITON_INTERPRET" in os.environ)
    """)
    err, has_grad, softmax_err, env_set = out.split()
    assert float(err) < 1e-5 and has_grad == "True" and float(softmax_err) < 1e-6 and env_set == "False"


def test_import_and_cpu_path_without_triton():
    """Triton missing: `import flashlab` works, CPU attention takes the PyTorch path, and a
    Triton kernel says what is missing."""
    out = _run_python("""
        import sys, importlib.util
        real = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] == "triton" else real(name, *a)
        sys.modules["triton"] = None                      # `import triton` raises ImportError
        import torch, torch.nn.functional as F, flashlab
        q = torch.randn(2, 3, 10, 8)
        print((flashlab.attention(q, q, q, is_causal=True)
               - F.scaled_dot_product_attention(q, q, q, is_causal=True)).abs().max().item())
        try:
            flashlab.fused_softmax(q)
        except ImportError as e:
            print("ImportError:", "pip install triton" in str(e))
    """, env_drop=("TRITON_INTERPRET",))
    err, line = out.splitlines()
    assert float(err) < 1e-5 and line == "ImportError: True"


class _Block(torch.nn.Module):
    """A small model on flashlab attention: MultiHeadAttention (causal; q, k, v packed), then a
    float key mask through attention directly."""

    def __init__(self):
        super().__init__()
        self.mha = flashlab.MultiHeadAttention(32, 2, causal=True)
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x, mask):
        h = self.mha(x)
        q = self.proj(h).view(x.shape[0], x.shape[1], 2, 16).transpose(1, 2)
        return attention(q, q, q, attn_mask=mask).sum(-1)


def _model_inputs():
    torch.manual_seed(0)
    return _Block(), torch.randn(2, 9, 32), torch.randn(2, 1, 1, 9)


def test_compile_fullgraph_matches_eager():
    """torch.compile(fullgraph=True) captures both attention calls (packed and not) as custom-op
    nodes (one graph, no break); outputs and parameter gradients equal eager's. (aot_eager: the CI-sized
    backend; inductor is in the GPU script: its C++ compile takes minutes on 2 shared cores.)"""
    model, x, mask = _model_inputs()
    want = model(x, mask)
    want.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    got = torch.compile(model, backend="aot_eager", fullgraph=True)(x, mask)
    got.sum().backward()
    assert torch.equal(got, want)
    for p, g in zip(model.parameters(), grads):
        assert torch.allclose(p.grad, g, rtol=0, atol=1e-6)


@pytest.mark.skipif(CUDA, reason="the CPU's interpreted-tile count")
def test_a_compiled_cpu_call_compiles_once_and_is_counted_when_it_runs(monkeypatch):
    """The process's count of interpreted tiles (for InterpreterWarning) is state outside the graph.
    Traced, it was read and written in the graph, which Dynamo then guarded on its value: every
    call recompiled, the ninth fell back to eager (fullgraph=True raised). Now a compiled call,
    packed or not, any N, compiles once per shape and is counted by its op when it runs, so a
    compiled CPU model is told too."""
    from torch._dynamo.utils import counters

    from flashlab.launch import interpreter_notice as notice
    monkeypatch.setattr(notice, "_interpreted_tiles", 0)
    monkeypatch.setattr(notice, "INTERPRETER_NOTICE_TILES", 100)

    def layer(q, k, v, qkv):
        return attention(q, k, v, is_causal=True), flashlab.attention_qkvpacked(qkv)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))     # 2 heads × 2 × 2 tiles of 32 = 8 a call
    qkv = torch.randn(1, 20, 3, 2, 16)                           # 2 heads × 1 tile = 2 a call
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(10):
            compiled(q, k, v, qkv)
    assert counters["stats"]["unique_graphs"] == 1, "recompiled with the same shapes"
    assert notice._interpreted_tiles == 10 * (8 + 2)
    assert sum(issubclass(w.category, flashlab.InterpreterWarning) for w in caught) == 1
    want = layer(q, k, v, qkv)
    got = compiled(q, k, v, qkv)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_window_under_compile_and_export():
    """attention(window=…) is one custom-op node under torch.compile(fullgraph) and torch.export,
    the window carried as the op's two int arguments; outputs and gradients equal eager's."""
    def windowed(q, k, v):
        return attention(q, k, v, is_causal=True, window=(3, 0))

    q, k, v = (torch.randn(1, 2, 11, 16, requires_grad=True) for _ in range(3))
    want = windowed(q, k, v)
    want_grads = torch.autograd.grad(want.sum(), (q, k, v))
    torch._dynamo.reset()
    got = torch.compile(windowed, backend="aot_eager", fullgraph=True)(q, k, v)
    assert torch.equal(got, want)
    for g, w in zip(torch.autograd.grad(got.sum(), (q, k, v)), want_grads):
        assert torch.allclose(g, w, rtol=0, atol=1e-6)

    class Windowed(torch.nn.Module):
        def forward(self, q, k, v):
            return windowed(q, k, v)

    exported = torch.export.export(Windowed(), (q.detach(), k.detach(), v.detach()))
    calls = [n for n in exported.graph.nodes if str(n.target) == "flashlab.flash_attention_forward.default"]
    assert len(calls) == 1 and list(calls[0].args[-2:]) == [3, 0], [n.args for n in calls]
    assert torch.equal(exported.module()(q.detach(), k.detach(), v.detach()), want.detach())


def test_export_holds_the_custom_op():
    model, x, mask = _model_inputs()
    exported = torch.export.export(model, (x, mask))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert targets.count("flashlab.flash_attention_qkvpacked_forward.default") == 1, targets   # MultiHeadAttention
    assert targets.count("flashlab.flash_attention_forward.default") == 1, targets            # the masked call
    assert torch.equal(exported.module()(x, mask), model(x, mask))


@pytest.mark.parametrize("case", ["causal", "float mask", "bool mask + dropout + gqa", "window + float mask",
                                  "uint8 mask"])
def test_opcheck(case):
    q = torch.randn(1, 4, 5, 16, requires_grad=True)
    k, v = (torch.randn(1, 4 if case != "bool mask + dropout + gqa" else 2, 7, 16, requires_grad=True)
            for _ in range(2))
    args = {"causal": (q, k, v, None, 0.0, None, True, 0.25, "ieee"),
            "float mask": (q, k, v, torch.randn(1, 1, 5, 7, requires_grad=True), 0.0, None, False, 0.25, "ieee"),
            "bool mask + dropout + gqa": (q, k, v, torch.rand(5, 7) > 0.3, 0.3, torch.tensor(11), False, 0.25,
                                          "ieee"),
            "window + float mask": (q, k, v, torch.randn(1, 1, 5, 7, requires_grad=True), 0.0, None, True, 0.25,
                                    "ieee", 2, 0),
            # neither bool nor float (attention() refuses it; the op takes it as additive): the fake's L must
            # have the real one's shape, L with each row's fix (a review found them differing)
            "uint8 mask": (q, k, v, torch.zeros(1, 1, 5, 7, dtype=torch.uint8), 0.0, None, False, 0.25, "ieee")}[case]
    result = torch.library.opcheck(torch.ops.flashlab.flash_attention_forward.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


def _layouts(batch, n, heads, head_dim, device="cpu", dtype=torch.float32):
    """q, k, v as attention layers pass them: contiguous (B, H, N, D); one (B, N, 3, H, D)
    projection viewed and permuted (not dense: each of q, k, v skips the other two); a dense
    (B, N, H, D) tensor transposed (Hugging Face's layout)."""
    qkv = torch.randn(batch, n, 3, heads, head_dim, device=device, dtype=dtype)
    dense = [torch.randn(batch, n, heads, head_dim, device=device, dtype=dtype).transpose(1, 2) for _ in range(3)]
    return {"contiguous": tuple(t.contiguous() for t in qkv.permute(2, 0, 3, 1, 4)),
            "projection": tuple(qkv.permute(2, 0, 3, 1, 4)),
            "dense transposed": tuple(dense)}


@pytest.mark.parametrize("n", [20, 140])               # the small path's length, and the general kernels'
def test_o_follows_qs_layout_so_merging_heads_is_a_view(n):
    """O is (B, N, H, D) in memory when q's heads lie closer than its rows, as SDPA's flash
    backend returns it: the layer's transpose(1, 2).reshape(B, N, H·D) is then a view (no copy
    of O per layer); contiguous q keeps a contiguous O. Values against float64."""
    for name, (q, k, v) in _layouts(2, n, 4, 16).items():
        out = attention(q, k, v)
        assert out.stride() == output_like(q).stride(), name
        merged = out.transpose(1, 2).reshape(2, n, 64)
        assert (merged.data_ptr() == out.data_ptr() and merged._base is not None) == (name != "contiguous"), name
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        assert_close(out, want, tol=1e-5, what=name)


@pytest.mark.parametrize("n", [5, 140])
@pytest.mark.parametrize("layout", ["projection", "dense transposed"])
def test_opcheck_with_the_layouts_attention_layers_pass(layout, n):
    """The op's fake says O's real strides for every layout (torch.compile's Inductor stops a
    graph whose custom-op output strides differ from the fake's)."""
    q, k, v = (t.requires_grad_() for t in _layouts(1, n, 2, 16)[layout])
    result = torch.library.opcheck(torch.ops.flashlab.flash_attention_forward.default,
                                   (q, k, v, None, 0.0, None, False, 0.25, "ieee"))
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("n", [8, 140])
def test_backward_ops_fake_says_the_gradients_strides_when_rows_are_strided(n):
    """q, k, v whose head dimension is not contiguous (a transposed view): the kernels read
    row-contiguous copies, and the gradients must still come back in the layout the backward
    op's fake says (empty_like of each input), or Inductor stops the compiled backward."""
    q, k, v = (torch.randn(1, 2, 16, n).transpose(-1, -2) for _ in range(3))      # (1, 2, n, 16), stride(-1) = n
    out, lse = ops.flash_attention_forward(q, k, v, None, 0.0, None, False, 0.25, "ieee")
    grad_out = torch.randn_like(out)
    args = (grad_out, q, k, v, out, lse, None, 0.0, None, False, 0.25, "ieee", False)
    result = torch.library.opcheck(torch.ops.flashlab.flash_attention_backward.default, args,
                                   test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++", "clang++"))),
                    reason="Inductor compiles C++ for the CPU: no C++ compiler here")
def test_inductor_compiles_a_layer_that_passes_transposed_heads():
    """Inductor, not aot_eager: it checks a custom op's output strides against the fake's. A
    Hugging Face-style layer (one projection, per-head views transposed to (B, H, N, D), the
    output merged back) compiles, forward and backward, on the small path (N = 20) and the
    general kernels (N = 140), and matches SDPA. (About 25 s with a cold Inductor cache.)"""
    torch.manual_seed(0)
    heads, head_dim = 4, 16
    proj, proj_out = torch.nn.Linear(heads * head_dim, 3 * heads * head_dim), torch.nn.Linear(64, 64)

    def layer(x, fn):
        batch, n, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in proj(x).view(batch, n, 3, heads, head_dim).unbind(2))
        return torch.tanh(proj_out(fn(q, k, v).transpose(1, 2).reshape(batch, n, heads * head_dim)))

    for n in (20, 140):
        x = torch.randn(2, n, heads * head_dim, requires_grad=True)
        grad = torch.randn(2, n, heads * head_dim)
        want = layer(x, F.scaled_dot_product_attention)
        (want_dx,) = torch.autograd.grad(want, x, grad)
        torch._dynamo.reset()
        # no cached graph: code compiled against another fake would not check this one's strides
        with torch._inductor.config.patch(fx_graph_cache=False):
            got = torch.compile(lambda x: layer(x, attention), fullgraph=True)(x)
            (got_dx,) = torch.autograd.grad(got, x, grad)
        assert_close(got, want.double(), tol=1e-5, what=f"out, N = {n}")
        assert_close(got_dx, want_dx.double(), tol=1e-5, what=f"dx, N = {n}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [20, 256])
@pytest.mark.parametrize("layout", ["contiguous", "projection", "dense transposed"])
def test_opcheck_with_the_layouts_attention_layers_pass_on_cuda(layout, n):
    """On a GPU: N = 256, D = 64, bf16 takes the Hopper kernels on an H100/H200, whose O followed
    a dense q's strides (empty_like) while the fake said contiguous: Inductor then stopped a
    compiled Hugging Face-style layer. N = 20: the small path."""
    q, k, v = (t.requires_grad_() for t in _layouts(2, n, 4, 64, "cuda", torch.bfloat16)[layout])
    result = torch.library.opcheck(torch.ops.flashlab.flash_attention_forward.default,
                                   (q, k, v, None, 0.0, None, False, 0.125, "tf32"))
    assert set(result.values()) == {"SUCCESS"}, result
    layer = torch.compile(lambda q, k, v: attention(q, k, v).transpose(1, 2).reshape(2, n, 256) * 2, fullgraph=True)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double()).transpose(1, 2).reshape(2, n, 256) * 2
    with torch._inductor.config.patch(fx_graph_cache=False):     # compiled here, against this fake
        assert_close(layer(q, k, v), want, tol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_cpu_is_right(dtype):
    """The interpreter's bf16 arithmetic is wrong (2.6e8 where SDPA gives −0.21): flashlab
    computes half precision in fp32 on the CPU and casts. Checked against float64."""
    q, k, v = (torch.randn(1, 2, 40, 32).to(dtype).requires_grad_() for _ in range(3))
    out = attention(q, k, v, is_causal=True)
    assert out.dtype == dtype
    grad = torch.randn_like(out)
    out.backward(grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    want.backward(grad.double())
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    assert_close(out, want, tol=tol)
    for got, ref in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert_close(got, ref, tol=2 * tol)


@pytest.mark.parametrize("mask_shape", [(2, 3, 6, 7), (2, 1, 1, 7), (6, 7), (3, 1, 7)])
def test_float_mask_gets_sdpas_gradient(mask_shape):
    """dS, summed over the mask's broadcast dimensions: the kernel path against SDPA."""
    q = torch.randn(2, 3, 6, 16, requires_grad=True)
    k, v = torch.randn(2, 3, 7, 16, requires_grad=True), torch.randn(2, 3, 7, 16, requires_grad=True)
    mask = torch.randn(mask_shape, requires_grad=True)
    grad = torch.randn(2, 3, 6, 16)
    attention(q, k, v, attn_mask=mask).backward(grad)
    got = [t.grad for t in (q, k, v, mask)]
    for t in (q, k, v, mask):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask).backward(grad)
    for name, a, t in zip(("q", "k", "v", "mask"), got, (q, k, v, mask)):
        assert a.shape == t.shape
        assert_close(a, t.grad.double(), tol=1e-5, what=f"d{name}")


def test_float_mask_gradcheck_in_float64():
    """float64 runs the PyTorch path; gradcheck differentiates it w.r.t. q, k, v and the mask."""
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.randn(1, 1, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c, m: attention(a, b, c, attn_mask=m, is_causal=True),
                                    (q, k, v, mask))


def test_backward_when_only_the_mask_requires_grad():
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    mask = torch.randn(1, 2, 5, 5, requires_grad=True)
    attention(q, k, v, attn_mask=mask).sum().backward()
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum(), mask)[0]
    assert_close(mask.grad, want.double(), tol=1e-5)


def _sdpa_check(q, k, v, tol=1e-5, **kwargs):
    """Output and gradients of flashlab.attention against SDPA in float64."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(q, k, v, **kwargs)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    mask = kwargs.pop("attn_mask", None)
    want = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=None if mask is None else
                                          (mask if mask.dtype == torch.bool else mask.double()), **kwargs)
    assert out.shape == want.shape and out.dtype == q.dtype
    if out.numel():
        assert_close(out, want, tol=tol)
    grad = torch.randn_like(out)
    out.backward(grad)
    want.backward(grad.double())
    for t, t64 in ((q, q64), (k, k64), (v, v64)):
        assert t.grad.shape == t.shape
        if t.numel():
            assert_close(t.grad, t64.grad, tol=10 * tol)


@pytest.mark.parametrize("shapes", [
    ((7, 16), (9, 16), (9, 16)),                          # 2-D (N, D)
    ((3, 7, 16), (3, 9, 16), (3, 9, 16)),                 # 3-D (H, N, D)
    ((2, 2, 3, 7, 16), (2, 2, 3, 9, 16), (2, 2, 3, 9, 16)),   # 5-D
    ((2, 3, 7, 16), (1, 3, 9, 16), (1, 3, 9, 16)),        # k/v batch broadcasts
    ((1, 2, 7, 16), (1, 2, 9, 16), (1, 2, 9, 24)),        # Dv > D
    ((1, 2, 7, 32), (1, 2, 9, 32), (1, 2, 9, 8)),         # Dv < D
])
def test_every_rank_and_value_width(shapes):
    _sdpa_check(*(torch.randn(s) for s in shapes), is_causal=True)


@pytest.mark.parametrize("shapes,kwargs", [
    (((2, 8, 9, 16), (2, 1, 9, 16), (2, 1, 9, 16)), {}),                     # k, v of one head serve every q head
    (((2, 1, 9, 16), (2, 4, 9, 16), (2, 4, 9, 16)), {}),                     # q of one head meets every k head
    (((2, 4, 9, 16), (1, 4, 9, 16), (2, 4, 9, 16)), {}),                     # k's batch 1, v's 2
    (((2, 4, 9, 16), (2, 1, 9, 16), (2, 4, 9, 16)), {"is_causal": True}),   # k's heads 1, v's 4
    (((2, 1, 9, 16), (1, 4, 9, 16), (2, 4, 9, 16)), {}),                     # all three broadcast
    (((9, 16), (2, 3, 11, 16), (2, 3, 11, 16)), {}),                         # (N, D) beside (B, H, N, D)
    (((1, 1, 1, 16), (3, 2, 17, 16), (3, 2, 17, 16)), {"is_causal": True}),  # N = 1
    (((2, 8, 9, 16), (1, 2, 9, 16), (2, 2, 9, 16)), {"enable_gqa": True}),  # GQA, k's batch broadcast
    (((2, 4, 9, 16), (2, 2, 11, 16), (2, 1, 11, 16)), {"enable_gqa": True}),  # GQA, k and v of different heads
    (((1, 6, 9, 16), (2, 2, 11, 16), (1, 3, 11, 16)), {"enable_gqa": True, "is_causal": True}),   # 2 and 3 of 6
])
def test_leading_dimensions_broadcast_as_in_sdpa(shapes, kwargs):
    """SDPA broadcasts q, k and v over every dimension but (N, D), the heads too (a fuzzer found flashlab
    refusing a k of one head, a q of one head, and k and v of different batches, blaming the query), and
    with enable_gqa takes k and v of different head counts, each dividing q's (a second fuzzer): output
    and gradients (summed over what was broadcast or repeated) against SDPA in float64."""
    q, k, v = (torch.randn(s, device=DEVICE) for s in shapes)
    _sdpa_check(q, k, v, tol=1e-5 if not CUDA else 3e-3, **kwargs)


@pytest.mark.parametrize("kv_shape,message", [
    ((2, 2, 9, 16), r"^key: has 2 heads, query 8\. For grouped-query attention pass enable_gqa=True"),
    ((2, 3, 9, 16), r"^key: has 3 heads, query 8\. .* the same number of heads \(or one, which broadcasts"),
    ((3, 8, 9, 16), r"^key: leading \(batch, head\) dimensions \(3, 8\) differ from query's \(2, 8\)\. .*broadcast"),
])
def test_leading_dimensions_that_do_not_broadcast_are_named(kv_shape, message):
    q = torch.randn(2, 8, 9, 16)
    with pytest.raises(ValueError, match=message):
        attention(q, torch.randn(kv_shape), torch.randn(kv_shape))


def test_the_tensor_that_does_not_broadcast_is_the_one_named():
    """k broadcasts with q and v does not: the message names value (a fuzzer found it naming key)."""
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(1, 4, 6, 8), torch.randn(3, 4, 6, 8)
    with pytest.raises(ValueError, match=r"^value: leading \(batch, head\) dimensions \(3, 4\)"):
        attention(q, k, v)


def test_gqa_in_3d_and_mask_with_causal_on_cpu():
    q, k, v = torch.randn(4, 7, 16), torch.randn(2, 9, 16), torch.randn(2, 9, 16)
    _sdpa_check(q, k, v, enable_gqa=True, is_causal=True)
    keep = torch.rand(7, 9) > 0.3
    _sdpa_check(torch.randn(1, 2, 7, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16), attn_mask=keep,
                is_causal=True)
    _sdpa_check(torch.randn(1, 2, 7, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16),
                attn_mask=torch.randn(7, 9), is_causal=True)


def test_float64_and_head_dim_over_256_take_the_pytorch_path():
    _sdpa_check(*(torch.randn(1, 2, 7, 16, dtype=torch.float64) for _ in range(3)), tol=1e-12, is_causal=True)
    _sdpa_check(*(torch.randn(1, 1, 5, 300) for _ in range(3)))


@pytest.mark.parametrize("q_shape,kv_shape", [
    ((2, 0, 5, 8), (2, 0, 5, 8)),      # zero heads (was ZeroDivisionError)
    ((0, 3, 5, 8), (0, 3, 5, 8)),      # zero batch
    ((2, 3, 0, 8), (2, 3, 5, 8)),      # no queries
    ((2, 3, 5, 8), (2, 3, 0, 8)),      # no keys: zeros, as SDPA
    ((2, 3, 5, 0), (2, 3, 5, 0)),      # D = 0: uniform weights, as SDPA
])
def test_zero_size_dimensions(q_shape, kv_shape):
    _sdpa_check(torch.randn(q_shape), torch.randn(kv_shape), torch.randn(*kv_shape[:-1], 4))


def test_zero_kv_heads_with_gqa():
    """No heads at all, with enable_gqa: an empty output and empty gradients. Not compared with SDPA,
    which in PyTorch 2.11 kills the process here (SIGFPE: its GQA check divides by the 0 key heads)."""
    q, k, v = (torch.randn(1, 0, 5, 8, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, enable_gqa=True)
    assert out.shape == (1, 0, 5, 8) and out.dtype == q.dtype
    out.sum().backward()
    assert all(t.grad.shape == t.shape for t in (q, k, v))


@pytest.mark.parametrize("device", ["meta"] + (["cuda"] if CUDA else []))
def test_mask_with_causal_refused_where_sdpa_refuses_it(device):
    """SDPA takes attn_mask with is_causal only in its CPU flash backend; elsewhere (CUDA, meta)
    it raises, and so does flashlab."""
    q = torch.randn(1, 2, 5, 8, device=device)
    with pytest.raises(ValueError, match="^attn_mask:"):
        attention(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool, device=device), is_causal=True)


def test_fp32_is_exact_unless_torch_allows_tf32():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")          # torch's default: exact
        assert input_precision(torch.float32, torch.device("cuda")) == "ieee"
        torch.set_float32_matmul_precision("high")             # = torch.backends.cuda.matmul.allow_tf32 = True
        assert input_precision(torch.float32, torch.device("cuda")) == "tf32"
        assert input_precision(torch.float32, torch.device("cuda"), exact_fp32=True) == "ieee"
        assert input_precision(torch.float32, torch.device("cpu")) == "ieee"      # the CPU has no TF32
        assert input_precision(torch.bfloat16, torch.device("cuda")) == "ieee"
    finally:
        torch.set_float32_matmul_precision(before)


def _no_kernels(monkeypatch):
    """Any launch of flashlab's kernels (either eager route, or the no-grad one) fails the test."""
    from flashlab.launch import small as flash_small

    def no_kernels(*args, **kwargs):
        raise AssertionError("the interpreted kernels ran")

    for owner, name in ((ops, "forward_kernels"), (flash_small, "forward"), (flash_small, "backward")):
        monkeypatch.setattr(owner, name, no_kernels)


def test_long_cpu_calls_take_the_pytorch_path(monkeypatch):
    """Above INTERPRETER_MAX_TILES the kernels are not called (here: forced by a low limit)."""
    import flashlab.api.attention as api
    monkeypatch.setattr(api, "INTERPRETER_MAX_TILES", 3)
    _no_kernels(monkeypatch)
    q, k, v = (torch.randn(1, 2, 70, 16, requires_grad=True) for _ in range(3))
    _sdpa_check(q, k, v, is_causal=True)
    _sdpa_check(q, k, v, attn_mask=torch.rand(70, 70) > 0.2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_pytorch_path_computes_half_inputs_in_float32(dtype, monkeypatch):
    """The PyTorch path (FLASHLAB_CPU_KERNELS=0, or past the interpreter's tile limit) gives half
    inputs float32 arithmetic, as the kernels and SDPA's CPU backends do. In fp16, scores plus a mask
    of finfo(float16).min (−65504, transformers' padding value) rounded the scores away (a row masked
    everywhere came out 1.4 from SDPA's average of V), and half-precision softmax doubled the error of
    the other rows. Against float64: within 1.25× SDPA's own error, row by row, under autocast and
    under vmap."""
    monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    _no_kernels(monkeypatch)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 16, dtype=dtype) for _ in range(3))
    mask = torch.zeros(2, 1, 37, 37, dtype=dtype)
    mask[:, :, 5, :] = torch.finfo(dtype).min                     # a padded query row: every key masked
    mask[:, :, :, 30:] = torch.finfo(dtype).min                   # padded keys
    exact_masked = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double())
    sdpa_masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ours = attention(q, k, v, attn_mask=mask)
    for row in (5, slice(None)):
        sdpa_error = rel_error(sdpa_masked[..., row, :], exact_masked[..., row, :])
        assert rel_error(ours[..., row, :], exact_masked[..., row, :]) <= 1.25 * sdpa_error + 1e-6, row
    q32, k32, v32 = (t.float() for t in (q, k, v))
    with torch.autocast("cpu", dtype=dtype):
        ours = attention(q32, k32, v32, is_causal=True)
        sdpa = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert ours.dtype == dtype and rel_error(ours, exact) <= 1.25 * rel_error(sdpa, exact)
    # inside torch.func transforms (the einsum version) too
    ours = torch.func.vmap(lambda *qkv: attention(*qkv, attn_mask=mask[0]))(q, k, v)
    assert ours.dtype == dtype
    assert rel_error(ours, exact_masked) <= 1.25 * rel_error(sdpa_masked, exact_masked) + 1e-6


def test_cpu_kernels_switched_off_by_the_environment(monkeypatch):
    """FLASHLAB_CPU_KERNELS=0: every CPU call takes the PyTorch path (read per call, so a
    signature seen with the kernels switches too); unset again, the kernels run."""
    q, k, v = (torch.randn(1, 2, 20, 16, requires_grad=True) for _ in range(3))
    attention(q, k, v)                                   # the signature seen with the kernels on
    monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    with monkeypatch.context() as patched:
        _no_kernels(patched)
        _sdpa_check(q, k, v, is_causal=True)
        _sdpa_check(q, k, v, attn_mask=torch.rand(20, 20) > 0.2)
    monkeypatch.delenv("FLASHLAB_CPU_KERNELS")
    from flashlab.launch import small as flash_small
    original, calls = flash_small.forward, []
    monkeypatch.setattr(flash_small, "forward", lambda *args: calls.append(1) or original(*args))
    _sdpa_check(q, k, v, is_causal=True)
    assert calls == [1], "with the switch unset the kernels run again"


def _math_sdpa_grads(q, k, v, mask, grad, dtype, **options):
    """Output and gradients (q, k, v, mask) of SDPA's math backend in ``dtype``: softmax differentiated
    as composed. Its fused CPU backend (what the default dispatch picks on a CPU) keeps only each row's
    log-sum-exp, as the kernels do, and loses log(Nk) beside a score of −3.4e38: its gradients of a
    row masked everywhere with finfo.min are Nk times these."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, mask = (t.detach().to(dtype).requires_grad_() for t in (q, k, v, mask))
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **options)
    return (out, *torch.autograd.grad(out, (q, k, v, mask), grad.to(dtype)))


def _sdpa_mask(mask, n_q, n_k, is_causal=False, window=None):
    """``mask`` as SDPA takes it beside flashlab's causal flag and window, which SDPA lacks (or refuses
    beside a mask): additive, bool's False and everything outside the band at −inf."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
    keep = flashlab.reference.naive.window_keep_mask(n_q, n_k, is_causal, window, mask.device)
    return mask if keep is None else mask.masked_fill(~keep, float("-inf"))


def _causal_as_a_window_on_cuda(options):
    """flashlab's options for a call beside a mask: CUDA refuses is_causal there, as SDPA does, so on a GPU
    the causal band is passed as a window's right edge 0 (beside any left edge the options have). A window is
    aligned at the end of the keys, is_causal at the start: the same band for Nq = Nk only, so a reference
    must be built from the options returned, not the ones passed."""
    options = dict(options)
    if CUDA and options.pop("is_causal", False):
        left, right = options.get("window") or (-1, -1)
        options["window"] = (left, 0 if right == -1 else min(right, 0))
    return options


def _flashlab_grads(q, k, v, mask, grad):
    q, k, v, mask = (t.detach().requires_grad_() for t in (q, k, v, mask))
    out = attention(q, k, v, attn_mask=mask)
    return (out, *torch.autograd.grad(out, (q, k, v, mask), grad))


@pytest.mark.parametrize("n", [9, 130])            # the small path's length, and the general kernels'
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_masked_everywhere_with_finfo_min_give_sdpas_mean_of_v_and_its_gradients(dtype, n):
    """A query row whose every key is masked with finfo(dtype).min (transformers' padding value) or a
    bias past +2.4e38: SDPA's scores are all equal there, so it averages V. In the kernels' base-2 scores
    such a bias overflowed to ±inf: zeros (or NaN) where SDPA averages, a fuzzer found; it now saturates.
    The gradients of such a row then need each row's fix (tile.l_fix): without it they were Nk
    times SDPA's math backend's. Output and the gradients of q, k, v and the mask against float64 SDPA."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 16, dtype=dtype, device=DEVICE) for _ in range(3))
    mask = torch.zeros(2, 1, n, n, dtype=dtype, device=DEVICE)
    mask[0, :, :3, :] = torch.finfo(dtype).min                    # batch 0, rows 0-2: every key masked
    mask[0, :, 3, :] = 3e38                                       # row 3: every key pushed up alike
    mask[:, :, 5, 2:] = torch.finfo(dtype).min                    # row 5 sees keys 0 and 1
    mask[1, :, 7, :] = torch.finfo(dtype).min                     # batch 1: row 7 (each row's fix, batch by batch)
    grad = torch.randn(2, 2, n, 16, dtype=dtype, device=DEVICE)
    got = _flashlab_grads(q, k, v, mask, grad)
    want = _math_sdpa_grads(q, k, v, mask, grad, torch.float64)
    tol = (1e-5 if not CUDA else 3e-3) if dtype == torch.float32 else 1e-2
    assert_close(got[0], want[0], tol=tol)
    assert_close(got[0][0, :, :4, :], v[0].double().mean(-2, keepdim=True).expand(2, 4, 16), tol=tol,
                 what="the huge rows: the mean of V")
    for g, w, name in zip(got[1:], want[1:], ("dq", "dk", "dv", "dmask")):
        assert_close(g, w, tol=2 * tol, what=name)


@pytest.mark.parametrize("n_q, n_k, dtype, options", [
    (130, 130, torch.float32, dict(is_causal=True)), (17, 130, torch.float32, dict(enable_gqa=True)),
    (200, 200, torch.float32, dict(window=(40, 3))), (130, 17, torch.float16, {}), (9, 9, torch.float16, {})])
def test_rows_masked_everywhere_beside_causal_gqa_windows_and_a_padded_batch(n_q, n_k, dtype, options):
    """Rows masked everywhere with finfo(float32).min, with causal masking, GQA (4 q heads, 2 k/v heads), a
    window, fp16 q/k/v beside the fp32 mask (SDPA's rule allows it; on a GPU the kernels then run in fp16),
    and a batch element whose keys are all padding: output and gradients against float64 SDPA (math)."""
    torch.manual_seed(n_q + n_k)
    heads_kv = 2 if options.get("enable_gqa") else 4
    q = torch.randn(2, 4, n_q, 16, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(2, heads_kv, n_k, 16, device=DEVICE, dtype=dtype) for _ in range(2))
    mask = torch.zeros(2, 1, n_q, n_k, device=DEVICE)
    mask[0, :, : n_q // 3, :] = torch.finfo(torch.float32).min            # batch 0: a third of its rows
    mask[1, ..., n_k // 2:] = torch.finfo(torch.float32).min              # batch 1: half its keys padding
    mask[1, ..., :2] = torch.finfo(torch.float32).min
    grad = torch.randn(2, 4, n_q, 16, device=DEVICE, dtype=dtype)
    window = options.pop("window", None)
    tol = (1e-5 if not CUDA else 3e-3) if dtype == torch.float32 else 5e-3
    q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
    options = _causal_as_a_window_on_cuda(dict(options, window=window))
    window = options.pop("window")
    out = attention(q_, k_, v_, attn_mask=mask, window=window, **options)
    got = (out, *torch.autograd.grad(out, (q_, k_, v_), grad))
    mask = _sdpa_mask(mask, n_q, n_k, options.pop("is_causal", False), window)
    wants = _math_sdpa_grads(q, k, v, mask, grad, torch.float64, **options)
    for g, w, name in zip(got, wants, ("out", "dq", "dk", "dv")):
        assert_close(g, w, tol=tol if name == "out" else 2 * tol, what=name)


@pytest.mark.parametrize("n", [9, 130])
def test_rows_shifted_far_get_the_gradients_of_their_own_forward(n):
    """A whole row shifted by −1e9 (a mask value older code uses): in fp32 the scores round to steps of
    64, q·k is lost, and SDPA's fp32 output is as far from float64's as the kernels' (about 0.1-0.4).
    The saved L = m + log2 l lost log2 l there too, so the kernels' gradients were 4-13 times those of
    their own forward; with each row's fix they are fp32 SDPA's, to rounding."""
    torch.manual_seed(0)
    q, k, v, grad = (torch.randn(1, 2, n, 16, device=DEVICE) for _ in range(4))
    mask = torch.zeros(1, 1, n, n, device=DEVICE)
    mask[..., :3, :] = -1e9
    mask[..., 5, 2:] = -1e9
    got = _flashlab_grads(q, k, v, mask, grad)
    want = _math_sdpa_grads(q, k, v, mask, grad, torch.float32)
    for g, w, name in zip(got, want, ("out", "dq", "dk", "dv", "dmask")):
        assert_close(g, w, tol=1e-5 if not CUDA else 3e-3, what=name)


@pytest.mark.parametrize("n_q, n_k, mask_dtype, options", [
    (130, 130, torch.bool, {}), (130, 200, torch.float32, {}), (200, 200, torch.bool, dict(is_causal=True)),
    (200, 200, torch.float32, dict(window=(40, 3))), (130, 130, torch.float32, dict(dropout_p=0.3)),
    (17, 200, torch.bool, dict(enable_gqa=True)),
    # the small path's one-tile kernels (≤ 128 keys), forward and its one backward kernel
    (9, 9, torch.float32, {}), (17, 100, torch.bool, dict(is_causal=True)),
    (60, 128, torch.float32, dict(dropout_p=0.3)), (33, 77, torch.float32, dict(enable_gqa=True))])
def test_a_key_padding_mask_loaded_as_one_shared_row_gives_what_its_copies_give(monkeypatch, n_q, n_k, mask_dtype,
                                                                                 options):
    """A mask with stride 0 over the queries (key padding, (B, 1, 1, Nk)) is loaded as one 1 × BLOCK_N
    row per tile and broadcast over the queries (tile.mask_tile_ptrs), instead of BLOCK_M copies
    of it: by default in the general kernels and the small path's up to 64 keys, with FLASHLAB_MASK_ROW_SHARED=all
    in the small path's at 128 too.
    Lengths past the small path's 128 keys (the general kernels) and within them (the small path's), bool
    and float, causal, a window, dropout (the same seed), GQA: output and gradients against the same mask
    materialised (B, 1, Nq, Nk), which takes the copies' load, and against float64 SDPA."""
    from flashlab.launch import small as flash_small
    from flashlab.launch.masks import MaskArgs, row_shared
    torch.manual_seed(n_q + n_k)
    heads_kv = 1 if options.get("enable_gqa") else 2
    q = torch.randn(2, 2, n_q, 16, device=DEVICE)
    k, v = (torch.randn(2, heads_kv, n_k, 16, device=DEVICE) for _ in range(2))
    grad = torch.randn(2, 2, n_q, 16, device=DEVICE)
    keep = torch.ones(2, 1, 1, n_k, dtype=torch.bool, device=DEVICE)
    keep[0, ..., n_k - n_k // 3:] = False                                  # batch 0: its last third padding
    keep[1, ..., :5] = False
    mask = keep if mask_dtype == torch.bool else torch.zeros(keep.shape, device=DEVICE).masked_fill(
        ~keep, torch.finfo(torch.float32).min)
    materialised = mask.expand(2, 1, n_q, n_k).contiguous()
    small = n_k <= 128                                                     # which kernels the case is meant for
    assert flash_small.applies(n_q, n_k, 16, q.dtype) == small
    padding, full = (MaskArgs(m, m.expand(2, 2, n_q, n_k).stride(), True, m.dtype == torch.bool)
                     for m in (mask, materialised))
    tile = flash_small._pow2(n_k)                                            # the small kernels' one key tile
    monkeypatch.setenv("FLASHLAB_MASK_ROW_SHARED", "0")                      # the copies' load everywhere
    assert not row_shared(padding, small, tile)
    monkeypatch.delenv("FLASHLAB_MASK_ROW_SHARED")       # the default: the general kernels, small tiles ≤ 64 keys
    assert row_shared(padding, small, tile) == (not small or tile <= 64)
    monkeypatch.setenv("FLASHLAB_MASK_ROW_SHARED", "all")                    # every kernel
    assert row_shared(padding, small, tile)
    assert not row_shared(full, small, tile)

    options = _causal_as_a_window_on_cuda(options)       # the reference below follows what the calls were given

    def run(m):
        torch.manual_seed(1)                                               # dropout's seed: the same draws
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        out = attention(q_, k_, v_, attn_mask=m, **options)
        return (out, *torch.autograd.grad(out, (q_, k_, v_), grad))
    shared, copies = run(mask), run(materialised)
    for got, want, name in zip(shared, copies, ("out", "dq", "dk", "dv")):
        if CUDA:                    # two compiled kernels may contract multiply-adds differently
            assert_close(got, want, tol=1e-5, what=f"{name}: shared row against its copies")
        else:
            assert torch.equal(got, want), f"{name}: the shared row's result differs from its copies'"
    if not options.get("dropout_p"):
        options = dict(options)
        reference = _sdpa_mask(materialised, n_q, n_k, options.pop("is_causal", False), options.pop("window", None))
        want = _math_sdpa_grads(q, k, v, reference, grad, torch.float64, **options)
        for got, w, name in zip(shared, want, ("out", "dq", "dk", "dv")):
            assert_close(got, w, tol=1e-5 if not CUDA else 3e-3, what=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_finfo_min_padding_mask_warns_nothing(dtype):
    """Padding keys masked with finfo(dtype).min (transformers' value; T5 and BERT pass it) overflow
    to −inf in the kernels' base-2 scores, as intended and silently on a GPU. In the interpreter
    numpy warned "overflow encountered in multiply", and under warnings-as-errors (pytest -W
    error) the interpreter raised InterpreterError. Results equal SDPA's, forward and backward."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 20, 16, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 20, dtype=dtype)
    mask[0, ..., 15:] = torch.finfo(dtype).min
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = attention(q, k, v, attn_mask=mask)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
    want = F.scaled_dot_product_attention(*(t.double() for t in (q, k, v)), attn_mask=mask.double())
    want_grads = torch.autograd.grad(want.sum(), (q, k, v))
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_error(out, want) < tolerance
    for got, ref in zip(grads, want_grads):
        assert rel_error(got, ref) < tolerance


def test_dropout_p_one_drops_everything_as_sdpa_does():
    """SDPA takes dropout_p=1.0 (zeros, zero gradients); flashlab refused it ('not a probability
    in [0, 1)', a practitioner's trial). It now gives SDPA's result, packed or not."""
    q, k, v = (torch.randn(2, 3, 7, 16, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, dropout_p=1.0)
    want = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    assert torch.equal(out, want) and not out.any()
    for g in torch.autograd.grad(out.sum(), (q, k, v)):
        assert not g.any()
    qkv = torch.randn(2, 7, 3, 3, 16, requires_grad=True)
    packed = flashlab.attention_qkvpacked(qkv, dropout_p=1.0)
    assert packed.shape == (2, 7, 3, 16) and not packed.any()
    assert not torch.autograd.grad(packed.sum(), qkv)[0].any()


def test_many_interpreted_tiles_say_once_how_to_switch(monkeypatch):
    """A CPU process that gives the interpreter many tiles (a model trained on a CPU, a client
    library's tests) is told once, at the caller's line, that FLASHLAB_CPU_KERNELS=0 runs it at
    PyTorch's speed; a process that switched is not counted."""
    from flashlab.launch import interpreter_notice as notice
    monkeypatch.setattr(notice, "_interpreted_tiles", 0)
    monkeypatch.setattr(notice, "INTERPRETER_NOTICE_TILES", 30)
    q, k, v = (torch.randn(1, 2, 70, 16) for _ in range(3))      # 2 heads × 3 × 3 tiles of 32 = 18 a call
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attention(q, k, v)                                     # 18: below
        attention(q, k, v)                                     # 36: passes 30, said
        attention(q, k, v)                                     # said once only
    notices = [w for w in caught if issubclass(w.category, flashlab.InterpreterWarning)]
    assert len(notices) == 1 and notice._interpreted_tiles == 54
    assert "FLASHLAB_CPU_KERNELS=0" in str(notices[0].message) and "36 tiles" in str(notices[0].message)
    assert notices[0].filename == __file__, "points at the caller's line, not flashlab's"
    monkeypatch.setattr(notice, "_interpreted_tiles", 0)
    monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            attention(q, k, v)
    assert notice._interpreted_tiles == 0


def test_a_cpu_call_too_large_for_the_kernels_says_so_once(monkeypatch):
    """A learner timing "the kernel" on a CPU above the interpreter's tile limit timed the PyTorch path
    without knowing it (N = 1024 ran faster than N = 200): the first such call says so, at the caller's
    line, once; with FLASHLAB_CPU_KERNELS=0 (the PyTorch path asked for) nothing is said."""
    import flashlab.api.attention as api
    from flashlab.launch import interpreter_notice as notice
    monkeypatch.setattr(notice, "_told_of_pytorch_path", False)
    monkeypatch.setattr(api, "INTERPRETER_MAX_TILES", 3)
    q, k, v = (torch.randn(1, 2, 70, 16) for _ in range(3))     # 18 tiles of 32 × 32 > 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attention(q, k, v)
        attention(q, k, v, is_causal=True)                      # another signature: not said again
    notices = [w for w in caught if issubclass(w.category, flashlab.InterpreterWarning)]
    assert len(notices) == 1 and "PyTorch path" in str(notices[0].message) and "18 tiles" in str(notices[0].message)
    assert notices[0].filename == __file__, "points at the caller's line, not flashlab's"
    monkeypatch.setattr(notice, "_told_of_pytorch_path", False)
    monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attention(q, k, v, scale=0.5)


def test_seed_is_drawn_outside_the_op_and_replayed_in_backward():
    """Dropout through the op: the same torch seed gives the same output and gradients."""
    q, k, v = (torch.randn(1, 2, 9, 16, requires_grad=True) for _ in range(3))
    results = []
    for _ in range(2):
        torch.manual_seed(5)
        out = attention(q, k, v, dropout_p=0.4)
        results.append((out.detach(), *torch.autograd.grad(out.sum(), (q, k, v))))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_old_interpreters_scalar_index_is_repaired(monkeypatch):
    """Triton ≤ 3.6's interpreter converts a scalar with int() on a one-element 1-D array, which
    NumPy 2.5 refuses: runtime wraps that patch step (seen on the H200: Triton 3.6, NumPy 2.5.2).
    Here a stand-in with the old source is repaired, and a newer one is left alone."""
    import numpy as np
    from triton.runtime import interpreter

    from flashlab.launch import runtime

    class Scope:
        def __init__(self):
            self.changes = []

        def set_attr(self, obj, name, value):
            self.changes.append(name)
            setattr(obj, name, value)

    def _patch_lang_tensor(tensor, scope):
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    class Handle:
        data = np.array([7])                     # a scalar as the old interpreter holds it

    class Tensor:
        handle = Handle()

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", _patch_lang_tensor)
    runtime._repair_scalar_index()
    repaired = interpreter._patch_lang_tensor
    assert repaired is not _patch_lang_tensor
    scope = Scope()
    repaired(Tensor, scope)
    assert scope.changes == ["__index__", "__index__"] and Tensor().__index__() == 7
    runtime._repair_scalar_index()               # idempotent: not wrapped twice
    assert interpreter._patch_lang_tensor is repaired

    def newer(tensor, scope):                    # Triton ≥ 3.7 squeezes already: left alone
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", newer)
    runtime._repair_scalar_index()
    assert interpreter._patch_lang_tensor is newer


def _language_state():
    """Every non-module attribute of what Triton's interpreter patches (runtime's list)."""
    import types

    from flashlab.launch.runtime import _patched_by_the_interpreter
    return {(repr(owner), name): value for owner in _patched_by_the_interpreter()
            for name, value in vars(owner).items() if not isinstance(value, types.ModuleType)}


def test_interpreted_calls_leave_triton_language_as_they_found_it():
    """An interpreted kernel that calls a @triton.jit helper from another module (tl.cdiv, in
    every flashlab kernel) made Triton patch triton.language.core for good, and every kernel
    compiled afterwards in the process failed (on the H200: one CPU call broke all later CUDA
    calls). After CPU calls, forward and backward, masked, causal and windowed, nothing differs."""
    before = _language_state()
    q, k, v = (torch.randn(1, 2, 17, 16, requires_grad=True) for _ in range(3))
    mask = torch.rand(17, 17) > 0.3
    mask[:, 0] = True
    for kwargs in (dict(is_causal=True), dict(attn_mask=mask), dict(window=(4, 0))):
        attention(q, k, v, **kwargs).sum().backward()
    after = _language_state()
    changed = sorted(name for name in set(before) | set(after) if before.get(name) is not after.get(name))
    assert not changed, f"left patched after interpreted launches: {changed[:10]}"


def test_kernels_compile_for_a_gpu_after_cpu_calls(tmp_path):
    """The failure itself, on a CPU: Triton compiles ahead of time for an H100/H200 (sm_90, no
    GPU needed), with an empty kernel cache so nothing is reused, a kernel that calls tl.cdiv,
    after interpreted flashlab calls in the same process. (Without the repair: "'block_argument'
    object has no attribute ..." from tl.cdiv, as on the H200.)"""
    out = _run_python("""
        import os, tempfile
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
        import torch, triton, triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        SM90 = GPUTarget("cuda", 90, 32)

        def probe_source():
            @triton.jit
            def probe(X, n):
                tl.store(X + tl.program_id(0), tl.cdiv(n, 16))
            return ASTSource(fn=probe, signature={"X": "*i32", "n": "i32"}, constexprs={})

        @triton.jit
        def plain(X):
            tl.store(X, 1)

        try:   # can this Triton compile for sm_90 here? (a kernel without tl.cdiv: compiling
               # tl.cdiv once before the CPU calls would let it compile afterwards too)
            triton.compile(ASTSource(fn=plain, signature={"X": "*i32"}, constexprs={}), target=SM90)
        except Exception as exc:
            print("no-toolchain", type(exc).__name__, str(exc).splitlines()[0][:120] if str(exc) else "")
            raise SystemExit
        import flashlab
        q = torch.randn(1, 2, 17, 16, requires_grad=True)
        flashlab.attention(q, q, q, is_causal=True).sum().backward()
        triton.compile(probe_source(), target=SM90)
        print("compiled")
    """, script=tmp_path / "compile_after_cpu_calls.py")
    if out.startswith("no-toolchain"):
        pytest.skip(f"this Triton cannot compile for sm_90 here: {out}")
    assert out.split()[-1] == "compiled"


@pytest.mark.gpu
def test_cuda_calls_compile_after_cpu_calls_in_one_process():
    """The same in a fresh process, end to end: CPU calls (interpreted) first, then CUDA calls
    whose kernels compile only now (a shape and head dimension no earlier test compiled)."""
    out = _run_python("""
        import torch, flashlab
        q = torch.randn(1, 2, 17, 16, requires_grad=True)
        flashlab.attention(q, q, q, is_causal=True).sum().backward()
        x = torch.randn(1, 3, 37, 24, device="cuda", requires_grad=True)
        flashlab.attention(x, x, x, is_causal=True).sum().backward()
        ref = torch.nn.functional.scaled_dot_product_attention(x.double(), x.double(), x.double(), is_causal=True)
        print(float((flashlab.attention(x, x, x, is_causal=True) - ref).abs().max()))
    """)
    assert float(out.split()[-1]) < 1e-2


def test_sdpas_argument_names_and_is_causal_a_bool():
    """Code that calls SDPA by keyword (query=, key=, value=) swaps in flashlab.attention
    unchanged; is_causal must be a bool, as SDPA's must ('yes' used to act as True)."""
    import inspect
    sdpa_names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    assert list(inspect.signature(attention).parameters)[:8] == sdpa_names
    q, k, v = (torch.randn(2, 2, 9, 16, device=DEVICE) for _ in range(3))
    assert torch.equal(attention(query=q, key=k, value=v, is_causal=True), attention(q, k, v, is_causal=True))
    for bad in ("yes", None, 1):
        with pytest.raises(TypeError, match="is_causal: .* is not a bool"):
            attention(q, k, v, is_causal=bad)


@pytest.mark.parametrize("n", [9, 130])              # the small path's length, and the general kernels'
def test_autocast_casts_the_inputs_as_it_casts_sdpas(n):
    """Under torch.autocast, SDPA's floating inputs (a float mask too; not float64) are cast to
    autocast's dtype, so a float32 mask beside bf16 activations, or float32 inputs, work; flashlab
    takes the same inputs and returns what SDPA returns, in the same dtype."""
    device = DEVICE
    lower = torch.bfloat16
    q, k, v = (torch.randn(1, 2, n, 16, device=device) for _ in range(3))
    mask = torch.randn(1, 1, n, n, device=device)
    with torch.autocast(device, dtype=lower):
        for args in ((q, k, v), (q.to(lower), k, v), (q.to(lower), k.to(lower), v.to(lower))):
            got = attention(*args, attn_mask=mask)
            want = F.scaled_dot_product_attention(*args, attn_mask=mask)
            assert got.dtype == want.dtype == lower
            assert_close(got.float(), want.float(), tol=2e-2)
        as_64 = [t.double() for t in (q, k, v)]
        assert attention(*as_64).dtype == torch.float64           # float64 is not autocast's to change
    low = [t.to(lower) for t in (q, k, v)]               # outside autocast: SDPA takes a float32 mask too
    # against float64, not SDPA's default dispatch: on CUDA (PyTorch 2.11, an H100) that picks cuDNN, which
    # returns NaN or garbage for a float32 mask beside bf16 inputs (results/h100/mask_dtype_check_2026-12-06.txt)
    want = F.scaled_dot_product_attention(*(t.double() for t in low), attn_mask=mask.double())
    assert_close(attention(*low, attn_mask=mask).float(), want, tol=2e-2)
    with pytest.raises(ValueError, match="attn_mask: dtype torch.float64"):
        attention(*low, attn_mask=mask.double())                   # float64 is neither: refused, as SDPA does


def test_torch_func_transforms_run_the_einsum_version():
    """vmap, grad, jacrev and jvp (torch.func) see plain PyTorch operations: inside a transform
    the call takes `naive_attention`'s einsums. It used to fail in each ("Cannot access storage
    of BatchedTensorImpl", "must override the setup_context staticmethod")."""
    q, k, v = (torch.randn(3, 2, 9, 16, dtype=torch.float64) for _ in range(3))
    batched = torch.func.vmap(lambda a, b, c: attention(a, b, c, is_causal=True))(q, k, v)
    assert_close(batched, F.scaled_dot_product_attention(q, k, v, is_causal=True), tol=1e-12)
    grad_q = torch.func.grad(lambda a: attention(a, k, v).square().sum())(q)
    q_ = q.clone().requires_grad_()
    F.scaled_dot_product_attention(q_, k, v).square().sum().backward()
    assert_close(grad_q, q_.grad, tol=1e-12)
    jacobian = torch.func.jacrev(lambda a: attention(a, k[0, 0], v[0, 0]))(q[0, 0])
    assert jacobian.shape == (9, 16, 9, 16)
    direction = torch.randn_like(q)
    _, tangent = torch.func.jvp(lambda a: attention(a, k, v), (q,), (direction,))
    eps = 1e-6                                          # central difference, float64
    numeric = (attention(q + eps * direction, k, v) - attention(q - eps * direction, k, v)) / (2 * eps)
    assert_close(tangent, numeric, tol=1e-7)


def test_ranks_that_broadcast_and_any_finite_scale_as_sdpa():
    """k, v of a lower rank than q broadcast as SDPA broadcasts them ((H, N, D) beside
    (B, H, N, D)); a scale of 0 (every key alike) or below 0 is SDPA's too. Both were refused."""
    q = torch.randn(3, 2, 9, 16, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(2, 11, 16, device=DEVICE, requires_grad=True) for _ in range(2))
    out = attention(q, k, v, is_causal=False)
    want = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == want.shape == (3, 2, 9, 16)
    assert_close(out, want, tol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected = torch.autograd.grad(want.square().sum(), (q, k, v))
    for name, got, exp in zip("qkv", grads, expected):
        assert_close(got, exp, tol=1e-5, what=f"d{name}")          # dk, dv summed over q's batch
    for scale in (0.0, -0.5):
        assert_close(attention(q, q, q, scale=scale), F.scaled_dot_product_attention(q, q, q, scale=scale), tol=1e-5)
    assert_close(attention(q, q, q, scale=0.0), q.mean(-2, keepdim=True).expand_as(q), tol=1e-5)   # the mean of v


def test_zero_dim_tensors_for_scale_and_dropout_as_sdpa():
    """SDPA's argument parser reads a 0-d tensor as a number for ``scale`` and ``dropout_p`` (code
    that computes a scale as a tensor passes one); flashlab refused them. Anything else stays
    refused with the argument named: a one-element 1-d tensor (SDPA refuses it too), a bool."""
    q, k, v = (torch.randn(2, 3, 17, 16, device=DEVICE) for _ in range(3))
    for scale in (torch.tensor(0.3), torch.tensor(0.3, dtype=torch.float64, device=DEVICE), torch.tensor(2)):
        assert_close(attention(q, k, v, scale=scale), attention(q, k, v, scale=float(scale)), tol=1e-6)
        assert_close(attention(q, k, v, scale=scale), F.scaled_dot_product_attention(q, k, v, scale=scale), tol=1e-5)
    torch.manual_seed(3)
    dropped = attention(q, k, v, dropout_p=torch.tensor(0.25))
    torch.manual_seed(3)
    assert torch.equal(dropped, attention(q, k, v, dropout_p=0.25))
    for bad in (torch.tensor([0.3]), torch.tensor(True)):
        with pytest.raises(ValueError, match="scale"):
            attention(q, k, v, scale=bad)
    with pytest.raises(ValueError, match="dropout_p"):
        attention(q, k, v, dropout_p=torch.tensor(1.5))


def _jit_trace(fn, example_inputs):
    """torch.jit.trace with its own deprecation notice silenced, and any TracerWarning an error: the
    call must record nothing from the example's sizes as a constant."""
    class Traced(torch.nn.Module):
        def forward(self, *tensors):
            return fn(*tensors)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.trace.* is deprecated")
        warnings.simplefilter("error", torch.jit.TracerWarning)
        return torch.jit.trace(Traced(), example_inputs)


def test_jit_trace_records_a_graph_for_every_shape():
    """torch.jit.trace (deprecated, still used for old deployment paths) records the einsum version's plain
    PyTorch operations: it used to fail inside Triton's interpreter ("invalid operands of type pointer<int64>
    and triton.language.int32"), then recorded 1/sqrt(D) as a constant (a trace at D = 16 scaled D = 32's
    scores by 1/4, not 1/sqrt(32): a relative error of 0.19) among ~20 TracerWarnings from the checks.
    The graph traced at one shape now gives float64 attention's result at other lengths, head dimensions,
    batches and GQA groups, and tracing warns of nothing."""
    torch.manual_seed(0)
    shapes = lambda b, h, hkv, nq, nk, d: (torch.randn(b, h, nq, d), torch.randn(b, hkv, nk, d),  # noqa: E731
                                           torch.randn(b, hkv, nk, d))

    causal = _jit_trace(lambda q, k, v: attention(q, k, v, is_causal=True), shapes(1, 2, 2, 7, 7, 16))
    gqa = _jit_trace(lambda q, k, v: attention(q, k, v, enable_gqa=True), shapes(1, 4, 2, 7, 9, 16))
    padded = _jit_trace(lambda q, k, v, keep: attention(q, k, v, attn_mask=keep),
                        (*shapes(1, 2, 2, 7, 9, 16), torch.rand(1, 1, 1, 9) > 0.3))
    for b, h, hkv, nq, nk, d in ((2, 3, 3, 19, 19, 32), (1, 2, 2, 1, 1, 8), (3, 1, 1, 17, 17, 24)):
        q, k, v = shapes(b, h, hkv, nq, nk, d)
        reference = flashlab.naive_attention(q.double(), k.double(), v.double(), is_causal=True)
        assert_close(causal(q, k, v), reference, tol=1e-5)
    for b, h, hkv, nq, nk, d in ((2, 6, 3, 5, 17, 32), (1, 8, 2, 17, 1000, 8), (1, 3, 3, 4, 4, 16)):
        q, k, v = shapes(b, h, hkv, nq, nk, d)
        kv = [t.double().repeat_interleave(h // hkv, dim=1) for t in (k, v)]
        assert_close(gqa(q, k, v), flashlab.naive_attention(q.double(), *kv), tol=1e-5)
    q, k, v = shapes(2, 3, 3, 17, 33, 32)
    keep = torch.rand(2, 1, 1, 33) > 0.3
    reference = flashlab.naive_attention(q.double(), k.double(), v.double(), attn_mask=keep)
    assert_close(padded(q, k, v, keep), reference, tol=1e-5)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_a_one_dimensional_input_is_named_not_broadcast(which):
    """A 1-D tensor has no (N, D) to broadcast to the others' rank (SDPA raises too): the check names
    it, instead of blaming another argument's leading dimensions (or accepting it)."""
    tensors = {"q": torch.randn(2, 4, 5, 16), "k": torch.randn(2, 4, 7, 16), "v": torch.randn(2, 4, 7, 16)}
    tensors[which] = torch.randn(16)
    name = {"q": "query", "k": "key", "v": "value"}[which]      # the message names the parameter as passed
    with pytest.raises(ValueError, match=rf"^{name}: expected at least 2 dimensions.*{name}\.unsqueeze"):
        attention(tensors["q"], tensors["k"], tensors["v"])


def test_a_nested_tensor_is_named_with_what_to_use():
    """SDPA takes jagged nested tensors; flashlab's kernels take dense ones: said in one line that
    points to varlen_attention, instead of an AttributeError from inside the tile count."""
    nested = torch.nested.nested_tensor([torch.randn(2, 5, 16), torch.randn(2, 7, 16)], layout=torch.jagged)
    with pytest.raises(ValueError, match=r"^query: is a nested tensor.*varlen_attention"):
        attention(nested, nested, nested)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_strided_nested_and_sparse_inputs_are_named_in_one_line():
    """A practitioner's trial: the strided nested layout (torch.nested's default) failed inside PyTorch
    ("NestedTensorImpl doesn't support sizes"), a sparse query or mask inside .contiguous(); each is
    now named, with what to pass instead."""
    nested = torch.nested.nested_tensor([torch.randn(2, 5, 16), torch.randn(2, 7, 16)])     # layout torch.strided
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"^query: is a nested tensor.*varlen_attention"):
        attention(nested, nested, nested)
    with pytest.raises(ValueError, match=r"^key: is a nested tensor"):
        attention(q, nested, q)
    with pytest.raises(ValueError, match=r"^query: has layout torch.sparse_coo.*query.to_dense\(\)"):
        attention(q.to_sparse(), q, q)
    with pytest.raises(ValueError, match=r"^attn_mask: is layout torch.sparse_coo.*attn_mask.to_dense\(\)"):
        attention(q, q, q, attn_mask=torch.ones(8, 8).to_sparse())


def _neg_view(shape):
    """A float32 tensor carrying PyTorch's negative bit, as the public API makes one: the imaginary
    part of a conjugate. Its storage holds the values unnegated."""
    return torch.randn(shape, dtype=torch.complex64, device=DEVICE).conj().imag


@pytest.mark.parametrize("which", ["query", "key", "value", "attn_mask"])
def test_views_carrying_the_negative_bit_are_read_with_their_sign(which):
    """A practitioner's trial: attention read a negative view's storage, so z.conj().imag as a
    float mask, or a _neg_view query, gave the opposite sign's result (relative error ~1) silently."""
    inputs = {name: torch.randn(2, 2, 19, 16, device=DEVICE) for name in ("query", "key", "value")}
    inputs["attn_mask"] = torch.randn(2, 1, 19, 19, device=DEVICE)
    inputs[which] = _neg_view(inputs[which].shape)
    assert inputs[which].is_neg(), "the test needs a view with the negative bit"
    resolved = {name: t.resolve_neg().double() for name, t in inputs.items()}
    assert_close(attention(**inputs), F.scaled_dot_product_attention(**resolved), tol=1e-5 if not CUDA else 3e-3)
    if which != "attn_mask":                      # the gradient reaches the base through the view
        base = torch.randn(2, 2, 19, 16, device=DEVICE, requires_grad=True)
        inputs[which] = base.neg()._neg_view()
        assert inputs[which].is_neg()
        got, = torch.autograd.grad(attention(**inputs).square().sum(), base)
        inputs[which] = base.double()
        want, = torch.autograd.grad(F.scaled_dot_product_attention(
            **{name: t.double() for name, t in inputs.items()}).square().sum(), base)
        assert_close(got, want, tol=1e-4 if not CUDA else 1e-2)


def test_negative_views_in_the_packed_decode_and_varlen_entries():
    from flashlab.api.decode import decode_attention, reference_decode_attention
    from flashlab.api.varlen import cu_seqlens_from_lengths, reference_varlen_attention, varlen_attention

    qkv = _neg_view((2, 17, 3, 2, 16))
    q, k, v = (t.transpose(1, 2) for t in qkv.resolve_neg().unbind(2))
    assert_close(flashlab.attention_qkvpacked(qkv, is_causal=True).transpose(1, 2),
                 F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True),
                 tol=1e-5 if not CUDA else 3e-3)
    # decode reads rows of D contiguous elements, which .imag's views are not: _neg_view's are
    contiguous_neg_view = lambda *shape: torch.randn(shape, device=DEVICE).neg()._neg_view()  # noqa: E731
    q, k_cache, v_cache = contiguous_neg_view(3, 1, 2, 16), contiguous_neg_view(3, 40, 2, 16), \
        contiguous_neg_view(3, 40, 2, 16)
    lengths = torch.tensor([40, 1, 23], dtype=torch.int32, device=DEVICE)
    assert_close(decode_attention(q, k_cache, v_cache, lengths),
                 reference_decode_attention(q.resolve_neg(), k_cache.resolve_neg(), v_cache.resolve_neg(), lengths))
    q, k, v = (contiguous_neg_view(30, 2, 16) for _ in range(3))
    cu = cu_seqlens_from_lengths([12, 18], DEVICE)
    assert_close(varlen_attention(q, k, v, cu, cu, 18, 18, is_causal=True, exact_fp32=True),
                 reference_varlen_attention(q.resolve_neg(), k.resolve_neg(), v.resolve_neg(), cu, cu, is_causal=True))


def test_a_scale_that_varies_between_calls_compiles_with_fullgraph():
    """A practitioner's trial: under torch.compile(fullgraph=True), a scale that changed between calls
    became a symbolic float, and the scale check's math.isfinite could not take it ("Unsupported:
    torch.* op returned non-Tensor"); every Hugging Face model compiled with dynamic=True passes its
    layers' scaling this way."""
    torch._dynamo.reset()
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    compiled = torch.compile(lambda q, s: attention(q, q, q, scale=s), backend="aot_eager", fullgraph=True)
    for s in (0.5, 0.25, 0.125, -1.0):
        assert torch.equal(compiled(q, s), attention(q, q, q, scale=s)), s
    with pytest.raises(Exception, match="scale: expected a finite number"):   # Dynamo wraps it under fullgraph
        compiled(q, float("nan"))


@pytest.mark.skipif(CUDA, reason="the CPU's choice between the interpreter and the PyTorch path")
@pytest.mark.parametrize("route", ["window, interpreted kernels", "causal, FLASHLAB_CPU_KERNELS=0"])
def test_dynamic_lengths_compile_once_on_a_cpu(route, monkeypatch):
    """A practitioner's trial: with dynamic=True, a window's tile count (a Python loop over query
    blocks) and the PyTorch path's tiled loop fixed the length into the graph: one graph per length,
    and after eight FailOnRecompileLimitHit under fullgraph."""
    import torch._dynamo.testing

    from flashlab.reference.naive import window_keep_mask
    kwargs = {"is_causal": True, "window": (4, 0)} if route.startswith("window") else {"is_causal": True}
    if route.endswith("=0"):
        monkeypatch.setenv("FLASHLAB_CPU_KERNELS", "0")
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, **kwargs), fullgraph=True, dynamic=True,
                             backend=counter)
    graphs = []
    for n in (40, 50, 70, 90, 33, 61, 77, 100, 120, 13):
        q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
        got = compiled(q, k, v)
        keep = window_keep_mask(n, n, True, kwargs.get("window"))            # causal, and the window if any
        assert_close(got, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=keep),
                     what=f"N = {n}")
        got.sum().backward()
        graphs.append(counter.frame_count)
    assert graphs == [graphs[0]] * len(graphs), f"graphs compiled so far, per length: {graphs}"


@pytest.mark.skipif(CUDA, reason="the CPU's choice between the interpreter and the PyTorch path")
def test_an_export_with_dynamic_sizes_runs_at_every_size_it_declares():
    """A practitioner's trial: exported with B ≤ 16 and N ≤ 256, the program asserted 'Guard failed:
    2·B·⌈N/32⌉² ≤ 1024' (the interpreter's tile limit) at sizes inside that range. On a CPU an export
    with dynamic sizes now records the PyTorch path, which runs at any size."""
    from torch.export import Dim, export

    class Causal(torch.nn.Module):
        def forward(self, q, k, v):
            return attention(q, k, v, is_causal=True)

    q = torch.randn(2, 2, 40, 8)
    batch, length = Dim("B", max=16), Dim("N", min=2, max=256)
    exported = export(Causal(), (q, q, q), dynamic_shapes=[{0: batch, 2: length}] * 3)
    for shape in ((2, 2, 64, 8), (16, 2, 256, 8), (3, 2, 17, 8)):       # 2,048 tiles at the largest
        x = torch.randn(shape)
        assert_close(exported.module()(x, x, x), F.scaled_dot_product_attention(x.double(), x.double(), x.double(),
                                                                                is_causal=True), what=f"{shape}")


def test_inputs_sdpa_broadcasts_or_converts_are_taken():
    """A practitioner's trial: SDPA takes these and flashlab refused them (in one line each): a query
    of batch 1 or of fewer dimensions beside keys of batch B (it broadcasts), a float32 mask beside
    half-precision inputs, NumPy scalars for scale and dropout_p."""
    import numpy as np

    q, k, v = torch.randn(4, 40, 16, device=DEVICE), torch.randn(2, 4, 40, 16, device=DEVICE), \
        torch.randn(2, 4, 40, 16, device=DEVICE)
    tol = 1e-5 if not CUDA else 3e-3
    for query in (q, q[None]):                                # (H, N, D) and (1, H, N, D) beside (2, H, N, D)
        query = query.clone().requires_grad_()
        got = attention(query, k, v)
        want = F.scaled_dot_product_attention(query.double(), k.double(), v.double())
        assert got.shape == want.shape == (2, 4, 40, 16)
        assert_close(got, want, tol=tol)
        grad = torch.randn_like(got)
        assert_close(torch.autograd.grad(got, query, grad)[0], torch.autograd.grad(want, query, grad.double())[0],
                     tol=tol * 10, what="dq (summed over the broadcast batch)")
    # a float32 mask stays float32 beside half-precision inputs, as in SDPA: a fuzzer found it rounded to
    # bf16 (20-40x SDPA's error with a bias of size 50) and, in fp16, finite values past ±65504 made ±inf
    mask = torch.randn(40, 40, device=DEVICE) * 50
    mask[0, :] = -1e5                                          # a row fp16 cannot hold: −inf there, NaN or 0 out
    mask[1, 2] = 7e4
    for dtype in (torch.float16, torch.bfloat16):
        low = [t.to(dtype) for t in (q, k, v)]
        got = attention(*low, attn_mask=mask)
        want = F.scaled_dot_product_attention(*[t.double() for t in low], attn_mask=mask.double())
        assert got.dtype == dtype and torch.isfinite(got).all()
        sdpa_error = rel_error(F.scaled_dot_product_attention(*low, attn_mask=mask), want)
        assert rel_error(got, want) <= 3 * sdpa_error + 1e-3, (dtype, rel_error(got, want), sdpa_error)
    doubles = [t.double() for t in (q, k, v)]                 # float64 inputs take a float32 mask too
    assert_close(attention(*doubles, attn_mask=mask), F.scaled_dot_product_attention(*doubles, attn_mask=mask.double()),
                 dtype=torch.float64, what="float64 with a float32 mask")
    got = attention(q, k, v, scale=np.float32(0.5), dropout_p=np.float64(0.0))
    assert_close(got, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.5), tol=tol)
    with pytest.raises(TypeError, match="^enable_gqa: 'yes' is not a bool"):
        attention(q, k, v, enable_gqa="yes")
