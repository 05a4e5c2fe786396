"""The Hopper path (flashlab.kernels.hopper, flashlab.launch.hopper): who takes a call, and every step of
the ladder against float64. On a CPU the steps run in Triton's interpreter in fp32 with small
tiles; the GPU tests (an sm_90 GPU) check every step and candidate tile in bf16 and fp16."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from flashlab import attention
from flashlab.kernels.hopper import LADDER, Tiles
from flashlab.launch import autotune
from flashlab.launch import hopper as flash_hopper_launch
from flashlab.launch.spec import AttentionSpec
from flashlab.reference.float64 import TOLERANCE, reference_attention, reference_gradients, rel_error

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
hopper_gpu = pytest.mark.gpu(capability=9)   # the Hopper kernels use TMA
SMALL = {"forward": Tiles(32, 16, 4, 1), "dkdv": Tiles(16, 32, 4, 1), "dq": Tiles(32, 16, 4, 1)}


def fake(shape=(2, 4, 128, 64), dtype=torch.bfloat16, device="cuda"):
    """A tensor's outside as why_not_hopper reads it: no GPU needed to test the decision."""
    strides = [shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1]
    return SimpleNamespace(shape=torch.Size(shape), dtype=dtype, device=torch.device(device), data_ptr=lambda: 4096,
                           stride=lambda *d: tuple(strides) if not d else strides[d[0]],
                           element_size=lambda: torch.empty((), dtype=dtype).element_size())


@pytest.fixture
def hopper_machine(monkeypatch):
    """Pretend to be an sm_90 GPU with Triton 3.6, FLASHLAB_HOPPER=1."""
    monkeypatch.setenv("FLASHLAB_HOPPER", "1")
    monkeypatch.setattr(flash_hopper_launch, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(flash_hopper_launch, "_triton_version", lambda: (3, 6))


def test_the_common_case_on_hopper_takes_the_hopper_kernels(hopper_machine):
    q = fake()
    assert flash_hopper_launch.why_not_hopper(q, q, q, None, AttentionSpec(0.125)) is None


@pytest.mark.parametrize("change, reason", [
    (dict(q=fake(device="cpu")), "device cpu"),
    (dict(capability=(8, 0)), "compute capability"),
    (dict(capability=(10, 0)), "compute capability"),
    (dict(triton=(3, 5)), "Triton"),
    (dict(q=fake(dtype=torch.float32)), "dtype"),
    (dict(q=fake((2, 4, 128, 96))), "head dimension"),
    (dict(k=fake((2, 2, 128, 64))), "GQA"),
    (dict(mask=True), "attn_mask, dropout"),
    (dict(dropout=0.1), "attn_mask, dropout"),
    (dict(window=(16, 0)), "a window"),
    (dict(softcap=30.0), "a soft-cap"),
    (dict(scale=-1.0), "scale"),
    (dict(env="0"), "FLASHLAB_HOPPER=0"),
    (dict(forced=True), "autotune.force"),
])
def test_everything_else_falls_back_with_a_reason(hopper_machine, monkeypatch, change, reason):
    if "capability" in change:
        monkeypatch.setattr(flash_hopper_launch, "_capability", lambda device: change["capability"])
    if "triton" in change:
        monkeypatch.setattr(flash_hopper_launch, "_triton_version", lambda: change["triton"])
    if "env" in change:
        monkeypatch.setenv("FLASHLAB_HOPPER", change["env"])
    q = change.get("q", fake())
    k = change.get("k", fake())
    mask = torch.ones(1, dtype=torch.bool) if change.get("mask") else None
    with autotune.force(forward=autotune.candidates("forward", 64, (9, 0))[0]) if change.get("forced") \
            else contextlib.nullcontext():
        spec = AttentionSpec(change.get("scale", 0.125), window=change.get("window"),
                             softcap=change.get("softcap", 0.0), dropout_p=change.get("dropout", 0.0))
        got = flash_hopper_launch.why_not_hopper(q, k, k, mask, spec)
    assert got is not None and reason in got


def test_a_misaligned_view_falls_back(hopper_machine):
    q = fake()
    q.data_ptr = lambda: 4096 + 2          # a view starting one bf16 element in
    assert "16 bytes" in flash_hopper_launch.why_not_hopper(q, fake(), fake(), None, AttentionSpec(0.125))


def test_cpu_calls_never_reach_the_hopper_kernels(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the Hopper path was taken on a CPU")
    monkeypatch.setattr(flash_hopper_launch, "forward", refuse)
    monkeypatch.setattr(flash_hopper_launch, "backward", refuse)
    q, k, v = (torch.randn(1, 2, 40, 64, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, is_causal=True)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def _check_step(step, q, k, v, grad_out, causal, tiles, tol):
    spec = AttentionSpec(q.shape[-1] ** -0.5, is_causal=causal)
    out, lse = flash_hopper_launch.forward(q, k, v, spec, step, tiles=tiles["forward"])
    grads = flash_hopper_launch.backward(q, k, v, out, lse, grad_out, spec, step,
                                         dkdv_tiles=tiles["dkdv"], dq_tiles=tiles["dq"])
    refs = (reference_attention(q, k, v, is_causal=causal), *reference_gradients(q, k, v, grad_out, is_causal=causal))
    for name, got, ref in zip(("out", "dq", "dk", "dv"), (out, *grads), refs):
        err = rel_error(got, ref)
        assert err <= tol, f"{step.name} {name}: relative error {err:.2e} > {tol:.0e} ({tiles})"


@pytest.mark.parametrize("step", LADDER, ids=lambda s: s.name)
@pytest.mark.parametrize("causal", [False, True])
def test_every_step_matches_float64_in_the_interpreter(step, causal):
    """fp32 (the interpreter's half precision is not the GPU's); N = 40 is not a multiple of any
    tile, so the zero-filled rows past N and the masked diagonal are both exercised."""
    torch.manual_seed(0)
    q, k, v, grad_out = (torch.randn(1, 2, 40, 64) for _ in range(4))
    _check_step(step, q, k, v, grad_out, causal, SMALL, TOLERANCE[torch.float32])


def test_head_dimension_128_and_unequal_lengths_in_the_interpreter():
    torch.manual_seed(1)
    q, grad_out = torch.randn(1, 1, 24, 128), torch.randn(1, 1, 24, 128)
    k, v = torch.randn(1, 1, 56, 128), torch.randn(1, 1, 56, 128)
    _check_step(LADDER[-1], q, k, v, grad_out, True, SMALL, TOLERANCE[torch.float32])


def _every_configuration():
    for step in LADDER:
        for d in (64, 128):
            lists = [step.tiles[kernel][d] for kernel in ("forward", "dkdv", "dq")]
            for i in range(max(len(c) for c in lists)):
                tiles = dict(zip(("forward", "dkdv", "dq"), (c[min(i, len(c) - 1)] for c in lists)))
                yield pytest.param(step, d, tiles, id=f"{step.name}-D{d}-{i}")


@hopper_gpu
@pytest.mark.parametrize("step, d, tiles", list(_every_configuration()))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1000, 2048])
def test_every_hopper_configuration_matches_float64_on_the_gpu(step, d, tiles, dtype, causal, n):
    torch.manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 2, n, d, device="cuda", dtype=dtype) for _ in range(4))
    _check_step(step, q, k, v, grad_out, causal, tiles, TOLERANCE[dtype])


@hopper_gpu
def test_attention_takes_the_hopper_path_on_hopper(monkeypatch):
    calls = []
    forward = flash_hopper_launch.forward
    monkeypatch.setattr(flash_hopper_launch, "forward", lambda *a, **kw: calls.append(1) or forward(*a, **kw))
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = attention(q, k, v, is_causal=True)
    assert calls and rel_error(out, reference_attention(q, k, v, is_causal=True)) <= TOLERANCE[torch.bfloat16]
    monkeypatch.setenv("FLASHLAB_HOPPER", "0")
    calls.clear()
    attention(q, k, v, is_causal=True)
    assert not calls


def test_unset_follows_the_default(monkeypatch):
    """Unset, FLASHLAB_HOPPER takes ON_BY_DEFAULT."""
    monkeypatch.delenv("FLASHLAB_HOPPER", raising=False)
    monkeypatch.setattr(flash_hopper_launch, "ON_BY_DEFAULT", False)
    assert not flash_hopper_launch.enabled()
    monkeypatch.setattr(flash_hopper_launch, "ON_BY_DEFAULT", True)
    assert flash_hopper_launch.enabled()


@hopper_gpu
def test_short_sequences_take_the_small_path_before_the_hopper_kernels(monkeypatch):
    """N within the small path's limit at a Hopper head dimension: one key tile, not 128-row tiles."""
    monkeypatch.delenv("FLASHLAB_SMALL_PATH", raising=False)
    calls = []
    for name in ("forward", "backward"):
        original = getattr(flash_hopper_launch, name)
        monkeypatch.setattr(flash_hopper_launch, name, lambda *a, _o=original, **kw: calls.append(1) or _o(*a, **kw))
    q, k, v = (torch.randn(8, 4, 100, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, is_causal=True)
    out.sum().backward()
    assert not calls and rel_error(out, reference_attention(q, k, v, is_causal=True)) <= TOLERANCE[torch.bfloat16]
