"""flashlab.attention_qkvpacked: q, k, v packed in one (B, N, 3, H, D) tensor, as an attention
layer's fused projection makes them. Against float64; bit for bit against `flashlab.attention`
on the three views; its gradient written in qkv's own layout with no gathering copies; its
custom ops (opcheck, torch.compile); the layers that use it; bad inputs.

On a CPU the kernels run in Triton's interpreter (fp32; fp16/bf16 computed in fp32 there); the
same tests run compiled on a GPU, where bf16 is checked too (and the `cuda` ones only there)."""

import functools
import traceback

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from flashlab import (
    MultiHeadAttention,
    assert_close,
    attention,
    attention_qkvpacked,
    reference_attention,
    reference_gradients,
)
from flashlab.api import ops
from flashlab.train.tsp import EncoderLayer

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])


def _views(qkv):
    """q, k, v (B, H, N, D) of a (B, N, 3, H, D) tensor."""
    return [t.transpose(1, 2) for t in qkv.unbind(2)]


def _against_float64(B, N, H, D, is_causal, dtype, dropout_p=0.0):
    qkv = torch.randn(B, N, 3, H, D, device=DEVICE, dtype=dtype, requires_grad=True)
    out = attention_qkvpacked(qkv, is_causal=is_causal, exact_fp32=True)
    assert out.shape == (B, N, H, D) and out.is_contiguous()
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    q, k, v = _views(qkv)
    assert_close(out.transpose(1, 2), reference_attention(q, k, v, None, is_causal), tol=TOL[dtype], what="out")
    want = reference_gradients(q, k, v, grad_out.transpose(1, 2), None, is_causal)
    for name, got, ref in zip("qkv", _views(qkv.grad), want):
        assert_close(got, ref, tol=TOL[dtype], what=f"d{name}")
    assert qkv.grad.stride() == qkv.stride()


@pytest.mark.parametrize("N", [1, 17, 100, 129])        # 129: past the small path, the general kernels
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_float64(N, is_causal):
    _against_float64(2, N, 3, 16, is_causal, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_in_every_kernel_dtype(dtype):
    _against_float64(2, 50, 2, 32, True, dtype)


@pytest.mark.parametrize("N, D, dropout_p", [(20, 16, 0.0), (100, 64, 0.0), (33, 16, 0.3), (200, 16, 0.0)])
def test_same_numbers_as_attention_on_the_three_views(N, D, dropout_p):
    """The same kernels on the same data: outputs and gradients equal bit for bit (with dropout,
    the same seed draws the same mask), whether the small path or the general kernels run."""
    qkv = torch.randn(2, N, 3, 2, D, device=DEVICE, requires_grad=True)
    twin = qkv.detach().clone().requires_grad_()
    grad_out = torch.randn(2, N, 2, D, device=DEVICE)
    torch.manual_seed(7)
    packed = attention_qkvpacked(qkv, dropout_p=dropout_p)
    packed.backward(grad_out)
    torch.manual_seed(7)
    views = attention(*_views(twin), dropout_p=dropout_p).transpose(1, 2)
    views.backward(grad_out)
    assert torch.equal(packed, views)
    assert torch.equal(qkv.grad, twin.grad)


@pytest.mark.parametrize("N, route", [(20, "SmallPackedAttention"), (129, "EagerQKVPackedAttention")])
def test_eager_calls_take_the_small_paths_own_function_where_it_fits(N, route, monkeypatch):
    """Short sequences go straight to `flash_small.SmallPackedAttention` (one launch each way, no
    per-call dispatch); longer ones to the general route's Function; FLASHLAB_SMALL_PATH=0 too."""
    qkv = torch.randn(2, N, 3, 2, 16, device=DEVICE, requires_grad=True)

    def function(out):                    # the node under the output's transpose to (B, N, H, D)
        return type(out.grad_fn.next_functions[0][0]).__name__
    assert function(attention_qkvpacked(qkv)).startswith(route)
    monkeypatch.setenv("FLASHLAB_SMALL_PATH", "0")
    assert function(attention_qkvpacked(qkv)).startswith("EagerQKVPackedAttention")


class _Writes(TorchDispatchMode):
    """The aten operations a block runs that copy or gather tensors, outside Triton's interpreter
    (which on a CPU copies every kernel's buffers in and out; a GPU launch copies nothing)."""
    GATHERS = {"stack", "cat", "copy_", "clone", "_to_copy", "contiguous", "_unsafe_view"}

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.GATHERS and not any("triton" in f.filename for f in traceback.extract_stack()):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def _backward_gathers(layer_attention):
    layer = EncoderLayer(64, 4, 128, layer_attention).to(DEVICE)
    y = layer(torch.randn(2, 20, 64, device=DEVICE))
    with _Writes() as writes:
        y.sum().backward()
    return writes.ops


def test_an_encoder_layers_backward_gathers_no_gradients():
    """Packed, dQ, dK, dV land in views of the projection's output gradient; passed three views,
    autograd stacks them (split along dimension 2, one copy; with permute's views, two)."""
    assert _backward_gathers(attention) == []
    assert _backward_gathers(lambda q, k, v: attention(q, k, v)) == ["stack"]


def test_layers_take_the_packed_form_and_compute_the_same():
    """EncoderLayer and MultiHeadAttention hand qkv packed to flashlab.attention itself; any other
    attention_fn (a wrapper, SDPA) gets the three views. Same parameters, same numbers bit for bit."""
    for make in (lambda fn: EncoderLayer(32, 2, 64, fn), lambda fn: MultiHeadAttention(32, 2, causal=True,
                                                                                          attention_fn=fn)):
        torch.manual_seed(3)
        packed = make(attention).to(DEVICE)
        torch.manual_seed(3)
        views = make(lambda q, k, v, **kw: attention(q, k, v, **kw)).to(DEVICE)
        x = torch.randn(3, 17, 32, device=DEVICE)
        a, b = packed(x), views(x)
        assert torch.equal(a, b)
        a.square().sum().backward()
        b.square().sum().backward()
        for p, r in zip(packed.parameters(), views.parameters()):
            assert torch.equal(p.grad, r.grad)


def test_a_wrapper_of_attention_still_sees_q_k_v():
    """A wrapper made with functools.wraps copies attention's attributes: the layers decide by identity,
    so a wrapper that changes q or k (here it records them) is called, never bypassed."""
    seen = []

    @functools.wraps(attention)
    def recording(q, k, v, **kwargs):
        seen.append(q.shape)
        return attention(q, k, v, **kwargs)
    EncoderLayer(32, 2, 64, recording).to(DEVICE)(torch.randn(2, 9, 32, device=DEVICE))
    MultiHeadAttention(32, 2, attention_fn=recording).to(DEVICE)(torch.randn(2, 9, 32, device=DEVICE))
    assert seen == [(2, 2, 9, 16)] * 2


def test_multi_head_attention_with_a_mask_takes_the_views():
    layer = MultiHeadAttention(32, 2).to(DEVICE)
    x = torch.randn(2, 9, 32, device=DEVICE)
    keep = torch.rand(2, 1, 9, 9, device=DEVICE) > 0.3
    keep[..., 0] = True
    q, k, v = (t.transpose(1, 2) for t in layer.qkv(x).view(2, 9, 3, 2, 16).unbind(2))
    want = layer.out(F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(2, 9, 32))
    assert_close(layer(x, attn_mask=keep), want, tol=1e-5)


def test_any_layout_of_qkv():
    """A qkv that is a permuted view of another buffer, or whose head dimension is strided."""
    base = torch.randn(3, 2, 4, 11, 16, device=DEVICE)                     # (3, H, D·?, ...) made up layout
    qkv = base.permute(3, 2, 0, 1, 4)                                       # (11, 4, 3, 2, 16): B=11, N=4
    strided = torch.randn(2, 9, 3, 2, 32, device=DEVICE)[..., ::2]          # head dimension stride 2
    for t in (qkv, strided):
        t = t.detach().requires_grad_()
        out = attention_qkvpacked(t)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
        q, k, v = _views(t)
        assert_close(out.transpose(1, 2), reference_attention(q, k, v), tol=1e-5)
        for got, ref in zip(_views(t.grad), reference_gradients(q, k, v, grad_out.transpose(1, 2))):
            assert_close(got, ref, tol=1e-5)


def test_float64_and_torch_func_take_the_pytorch_path():
    qkv = torch.randn(2, 7, 3, 2, 8, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: attention_qkvpacked(t, is_causal=True), (qkv,))
    grad = torch.func.grad(lambda t: attention_qkvpacked(t.float()).square().sum())(qkv.detach())
    want, = torch.autograd.grad(attention_qkvpacked(qkv).square().sum(), qkv)
    assert_close(grad, want, tol=1e-5)


def test_autocast_casts_qkv_as_attention_does():
    qkv = torch.randn(2, 12, 3, 2, 16, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        packed = attention_qkvpacked(qkv)
        views = attention(*_views(qkv)).transpose(1, 2)
    assert packed.dtype == views.dtype == torch.bfloat16
    assert torch.equal(packed, views)


def test_a_second_derivative_raises():
    qkv = torch.randn(1, 5, 3, 1, 16, device=DEVICE, requires_grad=True)
    grad, = torch.autograd.grad(attention_qkvpacked(qkv).sum(), qkv, create_graph=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        grad.sum().backward()


@pytest.mark.parametrize("bad, message", [
    (lambda: torch.randn(2, 5, 2, 16), r"qkv: expected a \(B, N, 3, H, D\) tensor.*shape \(2, 5, 2, 16\)"),
    (lambda: torch.randn(2, 5, 4, 2, 16), r"qkv: .*stacked in dimension 2.*shape \(2, 5, 4, 2, 16\)"),
    (lambda: [[1.0]], r"qkv: .* got list"),
])
def test_a_wrong_qkv_is_named(bad, message):
    with pytest.raises(ValueError, match=message):
        attention_qkvpacked(bad())


def test_bad_options_are_named():
    qkv = torch.randn(1, 4, 3, 1, 16)
    with pytest.raises(ValueError, match="dropout_p"):
        attention_qkvpacked(qkv, dropout_p=1.5)
    with pytest.raises(TypeError, match="is_causal"):
        attention_qkvpacked(qkv, is_causal="yes")


def test_the_custom_ops_pass_opcheck():
    """Schemas, fakes (strides included: Inductor checks them) and autograd registration."""
    qkv = torch.randn(2, 17, 3, 2, 16, device=DEVICE, requires_grad=True)
    for dropout_p, seed in ((0.0, None), (0.25, ops.draw_seed())):
        torch.library.opcheck(ops.flash_attention_qkvpacked_forward, (qkv, dropout_p, seed, True, 0.25, "ieee"))
    out, lse = ops.qkvpacked_forward_kernels(qkv.detach(), 0.0, None, True, 0.25, "ieee")
    grad_rows_strided = torch.randn(2, 2, 17, 32, device=DEVICE)[..., ::2]
    for grad_out in (torch.randn_like(out), grad_rows_strided):
        torch.library.opcheck(ops.flash_attention_qkvpacked_backward,
                              (grad_out, qkv.detach(), out, lse, 0.0, None, True, 0.25, "ieee"))


def test_compiled_layer_matches_eager_with_one_node_each_way():
    """torch.compile(fullgraph=True) of an encoder layer: the packed op in the forward graph and its
    backward op in the backward graph, no gathering of gradients, the same numbers as eager."""
    torch.manual_seed(0)
    layer = EncoderLayer(64, 4, 128, attention).to(DEVICE)
    x = torch.randn(3, 20, 64, device=DEVICE, requires_grad=True)
    weight = torch.randn(3, 20, 64, device=DEVICE)       # not .sum(): batch norm's output sums to a constant
    want = layer(x)
    (want * weight).sum().backward()
    want_grad, x.grad = x.grad, None
    graphs = []

    def backend(gm, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(g, _):
            graphs.append(g)
            return make_boxed_func(g)
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    torch._dynamo.reset()
    got = torch.compile(layer, backend=backend, fullgraph=True)(x)
    (got * weight).sum().backward()
    assert_close(got, want, tol=1e-5)
    assert_close(x.grad, want_grad, tol=1e-5)
    forward, backward = (str(g.graph) for g in graphs)
    assert "flash_attention_qkvpacked_forward" in forward
    assert "flash_attention_qkvpacked_backward" in backward
    assert "stack" not in backward and "select_backward" not in backward


@pytest.mark.gpu
@pytest.mark.parametrize("N", [20, 50, 100, 128, 1000])
@pytest.mark.parametrize("D", [16, 64])
def test_bf16_on_cuda(N, D):
    _against_float64(8, N, 4, D, False, torch.bfloat16)


@pytest.mark.gpu
def test_hopper_sizes_on_cuda_copy_their_gradients_in():
    """D = 64/128, N > 128, bf16: the Hopper kernels where the GPU has them, whose gradients are
    copied into the packed buffer."""
    _against_float64(2, 1024, 4, 128, True, torch.bfloat16)


def test_the_pytorch_path_returns_the_same_layout():
    """float64 (and anything else the kernels do not take) runs attention on the three views: the
    output is still contiguous (B, N, H, D), so the layer's reshape stays a view."""
    out = attention_qkvpacked(torch.randn(2, 37, 3, 2, 32, dtype=torch.float64, device=DEVICE))
    assert out.shape == (2, 37, 2, 32) and out.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_a_non_float_qkv_is_named(dtype):
    with pytest.raises(ValueError, match=r"^qkv: dtype .* qkv\.to\(torch\.float32\)"):
        attention_qkvpacked(torch.ones(2, 5, 3, 1, 16, dtype=dtype))


def test_exact_fp32_must_be_a_bool():
    qkv = torch.randn(1, 4, 3, 1, 16)
    with pytest.raises(TypeError, match="exact_fp32: 'yes' is not a bool"):
        attention_qkvpacked(qkv, exact_fp32="yes")
    with pytest.raises(TypeError, match="exact_fp32"):
        attention(*_views(qkv), exact_fp32=1)


@pytest.mark.skipif(CUDA, reason="the CPU's interpreted-tile count")
def test_an_export_with_dynamic_shapes_leaves_no_symbolic_state_behind():
    """The process-wide count of interpreted tiles (for InterpreterWarning) once kept the symbolic
    count a dynamic-shape export traced, and the next static export failed on it."""
    import flashlab.launch.interpreter_notice

    class Layer(torch.nn.Module):
        def forward(self, qkv):
            return attention_qkvpacked(qkv, is_causal=True)
    qkv = torch.randn(2, 20, 3, 2, 16)
    torch.export.export(Layer(), (qkv,), dynamic_shapes=({0: torch.export.Dim("B", max=4)},))
    assert type(flashlab.launch.interpreter_notice._interpreted_tiles) is int
    exported = torch.export.export(Layer(), (qkv,))
    assert torch.equal(exported.module()(qkv), Layer()(qkv))


def test_a_nested_qkv_is_named():
    nested = torch.nested.nested_tensor([torch.randn(5, 3, 2, 16), torch.randn(7, 3, 2, 16)], layout=torch.jagged)
    with pytest.raises(ValueError, match=r"^qkv: a nested tensor.*varlen_attention"):
        attention_qkvpacked(nested)
