"""flashlab.launch.direct: a compiled kernel is reused only for calls Triton would have sent to
the same compiled kernel, and gives the same results as Triton's own launch.

The caching rules are tested on CPU with a fake kernel (the fake records which launch ran); the
real kernels on a GPU (skipped without one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flashlab.launch import direct as direct_launch

CUDA = torch.cuda.is_available()


class FakeCompiled:
    """Stands for Triton's CompiledKernel: records the launches made through its C launcher."""

    def __init__(self):
        self.function, self.packed_metadata, self.direct_calls = "function", "metadata", []

    def run(self, *args):
        self.direct_calls.append(args)


class FakeKernel:
    """Stands for a @triton.jit function with runtime arguments (x, n) and one constexpr BLOCK:
    ``kernel[grid](...)`` is Triton's launch, counted, returning its compiled kernel."""

    def __init__(self):
        self.params = [SimpleNamespace(name="X", is_constexpr=False), SimpleNamespace(name="n", is_constexpr=False),
                       SimpleNamespace(name="BLOCK", is_constexpr=True)]
        self.compiled, self.triton_calls = FakeCompiled(), []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.triton_calls.append((grid, args, kwargs))
            return self.compiled
        return launch


@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors stand in for CUDA ones: the device and stream queries answer as a GPU's would."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    monkeypatch.delenv("FLASHLAB_DIRECT_LAUNCH", raising=False)
    monkeypatch.setattr(direct_launch, "_hooks_installed", lambda: False)
    direct_launch._compiled.clear()
    yield
    direct_launch._compiled.clear()


def _launch(kernel, plan, x, n=7):
    direct_launch.launch(kernel, plan, (3,), (x, n), 1, {"BLOCK": 16, "num_warps": 4})


def test_the_second_call_of_a_signature_skips_tritons_launch(fake_gpu):
    kernel, plan, x = FakeKernel(), ("plan",), torch.zeros(64)
    _launch(kernel, plan, x)
    _launch(kernel, plan, x)
    assert len(kernel.triton_calls) == 1
    # grid (3, 1, 1), the stream, the kernel's function and metadata, no hooks, the arguments, the constexprs
    assert kernel.compiled.direct_calls == [(3, 1, 1, 1234, "function", "metadata", None, None, None, x, 7, 16)]


def test_a_pointer_triton_would_specialise_differently_goes_through_triton(fake_gpu):
    """A view 2 bytes into its storage is not 16-byte aligned: Triton compiles another kernel for
    it, so the one compiled for aligned pointers must not be reused."""
    kernel, plan = FakeKernel(), ("plan",)
    storage = torch.zeros(64, dtype=torch.float16)
    _launch(kernel, plan, storage[:32])
    _launch(kernel, plan, storage[1:33])                  # misaligned: Triton's launch again
    _launch(kernel, plan, storage[8:40])                  # 16 bytes in: aligned, reused
    assert len(kernel.triton_calls) == 2
    assert len(kernel.compiled.direct_calls) == 1


def test_another_dtype_or_plan_goes_through_triton(fake_gpu):
    kernel, plan = FakeKernel(), ("plan",)
    _launch(kernel, plan, torch.zeros(64))
    _launch(kernel, plan, torch.zeros(64, dtype=torch.float16))
    _launch(kernel, ("another plan",), torch.zeros(64))
    assert len(kernel.triton_calls) == 3 and not kernel.compiled.direct_calls


def test_switched_off_or_hooked_every_launch_is_tritons(fake_gpu, monkeypatch):
    kernel, plan, x = FakeKernel(), ("plan",), torch.zeros(64)
    monkeypatch.setenv("FLASHLAB_DIRECT_LAUNCH", "0")
    for _ in range(3):
        _launch(kernel, plan, x)
    monkeypatch.delenv("FLASHLAB_DIRECT_LAUNCH")
    monkeypatch.setattr(direct_launch, "_hooks_installed", lambda: True)   # a profiler's launch hooks
    for _ in range(3):
        _launch(kernel, plan, x)
    assert len(kernel.triton_calls) == 6 and not kernel.compiled.direct_calls


def test_a_signature_it_cannot_order_stays_with_triton(fake_gpu):
    """A constexpr left to its default (not in the call's keywords) cannot be put in the
    launcher's argument list: that signature keeps Triton's launch."""
    kernel, plan, x = FakeKernel(), ("plan",), torch.zeros(64)
    for _ in range(3):
        direct_launch.launch(kernel, plan, (3,), (x, 7), 1, {"num_warps": 4})
    assert len(kernel.triton_calls) == 3 and not kernel.compiled.direct_calls


def test_hooks_are_seen_in_both_triton_forms():
    """Triton 3.6 keeps launch hooks in a chain object (empty: no hooks), later versions as None
    or a callable."""
    pytest.importorskip("triton")
    from triton import knobs
    runtime = knobs.runtime
    saved = runtime.launch_enter_hook
    try:
        runtime.launch_enter_hook = None
        assert not direct_launch._hooks_installed()
        runtime.launch_enter_hook = SimpleNamespace(calls=[])
        assert not direct_launch._hooks_installed()
        runtime.launch_enter_hook = SimpleNamespace(calls=[print])
        assert direct_launch._hooks_installed()
        runtime.launch_enter_hook = print
        assert direct_launch._hooks_installed()
    finally:
        runtime.launch_enter_hook = saved


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "dropout", "gqa", "misaligned"])
def test_gpu_direct_launch_gives_tritons_results_bit_for_bit(case, monkeypatch):
    from flashlab import attention
    torch.manual_seed(0)
    n, d, dtype = 50, 16, torch.bfloat16
    if case == "misaligned":       # q one element into its storage: a different compiled kernel
        q = torch.randn(3 * 4 * n * d + 1, device="cuda", dtype=dtype)[1:].view(3, 4, n, d).requires_grad_()
    else:
        q = torch.randn(3, 4, n, d, device="cuda", dtype=dtype, requires_grad=True)
    kv_heads = 2 if case == "gqa" else 4
    k, v = (torch.randn(3, kv_heads, n, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    mask = torch.rand(n, n, device="cuda") > 0.3 if case == "bool_mask" else None
    grad = torch.randn(3, 4, n, d, device="cuda", dtype=dtype)
    results = []
    for setting in ("0", "1", "1"):        # Triton's launch; the direct one's first call (Triton's); direct
        monkeypatch.setenv("FLASHLAB_DIRECT_LAUNCH", setting)
        q.grad = k.grad = v.grad = None
        torch.manual_seed(1)
        out = attention(q, k, v, attn_mask=mask, is_causal=case == "causal",
                        dropout_p=0.2 if case == "dropout" else 0.0, enable_gqa=case == "gqa")
        out.backward(grad)
        results.append((out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()))
    for triton_launch, direct in zip(results[0], results[2]):
        assert torch.equal(triton_launch, direct)


@pytest.mark.gpu
def test_gpu_direct_launch_is_taken_and_graph_capturable(monkeypatch):
    """The small path's second call of a signature launches directly (no JITFunction.run), and
    a forward+backward made of direct launches replays from a CUDA graph with eager's results."""
    from triton.runtime.jit import JITFunction

    from flashlab import attention
    from flashlab.launch.timing import capture_cuda_graph
    monkeypatch.delenv("FLASHLAB_DIRECT_LAUNCH", raising=False)
    q, k, v = (torch.randn(64, 8, 20, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)

    def step():
        q.grad = k.grad = v.grad = None
        out = attention(q, k, v)
        out.backward(grad)
        return out.detach()           # no grad_fn: the capture's autograd nodes are not kept alive past it
    # captured first (as tests/kernels/test_flash_small.py does): its warm-up makes the direct-launch entries
    graph, static_out = capture_cuda_graph(step)
    static_grads = (q.grad, k.grad, v.grad)
    graph.replay()
    torch.cuda.synchronize()
    replayed = [t.clone() for t in (static_out, *static_grads)]
    runs = []
    original = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **kw: runs.append(self) or original(self, *a, **kw))
    eager = step()
    assert runs == []                 # both kernels launched directly
    for got, want in zip(replayed, (eager, q.grad, k.grad, v.grad)):
        assert torch.equal(got, want)
