"""Tests for exercise 06 (backward kernels: dK/dV pass and dQ pass). The forward's O and
log-sum-exp come from the float64 reference, so this exercise does not depend on 05."""

import functools
import inspect
import io
import math
import tokenize

import pytest
import torch

from flashlab import assert_close, reference_attention, reference_gradients
from flashlab.reference.float64 import reference_logsumexp, rel_error
from tests.exercises.hints import backward_mistake, known_mistake, require, unwritten, unwritten_under
from tests.exercises.padded_launch import PaddedLaunch, launch_guarded

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 on a GPU goes through TF32 tensor cores; the backward chains three TF32 products
# (dP, dS·K, dSᵀ·Q), measured up to 3.1e-3 on an H200, so it gets 1e-2 there.
TOL = {torch.float32: 1e-5 if DEVICE == "cpu" else 1e-2, torch.float16: 3e-3}


P_HINT = ("\nhint: dV = Pᵀ dO is wrong too, so P is: check P = exp(S − L) with S = Q Kᵀ·scale (scaled once) "
          "and its masks (causal keeps key j ≤ query i: the diagonal takes part). L here is the natural-log "
          "log-sum-exp (not the base-2 L of notebook 06's kernels); with exp2, multiply by log2(e): "
          "P = exp2((S − L)·log2(e))")
ONE_KEY_HINT = ("\nhint: with one key, dQ and dK are 0 whatever P is (softmax over one score is 1, whatever the "
                "score), so dV = Pᵀ dO alone shows P: each query's P must be 1 for that key. Check P = exp(S − L) "
                "(L the natural-log log-sum-exp; with exp2, P = exp2((S − L)·log2(e))) and the masks: causal keeps "
                "key j ≤ query i, the diagonal included")
DV_SCALE_HINT = ("dK is right, so P is, and dV is exactly scale × the right dV: dV = Pᵀ dO has no softmax "
                 "scale (it is inside P already); only dK = scale · dSᵀ Q and dQ = scale · dS K take it")
DV_ONLY_HINT = ("dK = scale · dSᵀ Q is right, so P is: the mistake is in dV = Pᵀ dO alone (Pᵀ of each query block "
                "times its dO, summed over the query blocks, no scale, stored where the keys are valid)")
ONE_PASS_HINT = {
    "dq": ("dK and dV are right, so P and dS are: the mistake is in the dQ pass alone. dQ = scale · dS K sums "
           "over every key block the query block sees: check its loop's end (with is_causal, up to and including "
           "the block holding the diagonal: min(Nk, (start_m + 1)·BLOCK_M), start_m the query block's index) and which "
           "rows it stores"),
    "dk": ("dQ and dV are right, so P and dS are: the mistake is in dK = scale · dSᵀ Q alone, in the dK/dV pass. "
           "It sums over every query block that sees the key block (with is_causal, from the block holding the "
           "diagonal on): check that loop, as dV's, and dK's store"),
}


def _hint(what: str, err: float, head_dim: int, ok: dict, n_keys: int) -> str:
    """A hint naming the mistake when the errors of dQ, dK, dV (``ok``: which are right) have its
    signature. With one key, dQ = dK = 0 whatever P is, so only dV tells, and it tells of P. With
    dV correct (P right, the mistake after it), an error of d{q,k} within 1% of 2 is a flipped dS,
    of √D − 1 a missing scale 1/√D; with only one of dQ, dK wrong, the mistake is in that one's sum
    (its loop bounds, its store). With dQ and dK correct but dV wrong, P is right and the mistake is
    in dV alone (an error of 1 − scale: dV multiplied by the scale). With dV wrong and dQ or dK wrong
    too, P itself is wrong (e.g. L, natural log, used as base 2). A gradient whose kernel is still
    `pass` is not checked: its ``ok`` is None, and tells nothing."""
    if n_keys == 1:
        return ONE_KEY_HINT
    if what == "dv" and ok["dk"] and ok["dq"] is not False:      # dQ right, or not checked (dq_kernel still `pass`)
        return known_mistake(err, [(1 - head_dim ** -0.5, DV_SCALE_HINT)]) or f"\nhint: {DV_ONLY_HINT}"
    if ok["dv"] is False:                 # (None: dV not checked, its kernel still `pass`)
        return P_HINT
    signatures = [(2.0, "dS = P ∘ (dP − D), not (D − dP)"),
                  (math.sqrt(head_dim) - 1, "dK = scale · dSᵀ Q (and dQ = scale · dS K)")]
    other = "dk" if what == "dq" else "dq"
    return known_mistake(err, signatures) or (f"\nhint: {ONE_PASS_HINT[what]}" if ok[other] else "")


def _check_all(grads, wants, tol, inputs=None, checked=("dq", "dk", "dv")):
    """assert_close of (dq, dk, dv), with a hint when the errors have the signature of a known
    mistake; every error is looked at first, since which of dQ, dK, dV are right tells where the
    mistake is (P, dS, or one pass's sum). ``inputs``: (q, k, v, dO, is_causal), to recognise a
    usual slip (D_i left out, a scale missing) by recomputing it. ``checked``: the gradients a
    written kernel made (the others' kernel is still `pass`); the hints know nothing of the others."""
    ok = {what: (math.isfinite(rel_error(g, w)) and rel_error(g, w) <= tol) if what in checked else None
          for what, g, w in zip(("dq", "dk", "dv"), grads, wants)}
    for what, got, want in zip(("dq", "dk", "dv"), grads, wants):
        if what not in checked:
            continue
        try:
            assert_close(got, want, tol=tol, what=what)
        except AssertionError as error:
            slip = backward_mistake(what[1], got, *inputs, tol=tol) if inputs is not None else ""
            hint = (unwritten(got, "d" + what[1].upper()) or slip
                    or _hint(what, rel_error(got, want), got.shape[-1], ok, grads[1].shape[-2]))
            raise AssertionError(f"{error}{hint}") from None


@pytest.fixture
def exercise(exercise, monkeypatch):
    """conftest.py's `exercise`, each kernel launched on padded copies of its tensors (`launch_guarded`):
    a store outside dK, dV or dQ (an unmasked ragged end) is named, instead of aborting pytest."""
    for name, outputs in (("dkdv_kernel", {"DK", "DV"}), ("dq_kernel", {"DQ"})):
        monkeypatch.setattr(exercise, name, PaddedLaunch(getattr(exercise, name), functools.partial(launch_guarded,
                                                                                                     outputs)))
    return exercise


def _forward(q, k, v, is_causal):
    """O (in q's dtype) and the natural-log log-sum-exp (float32), computed in float64."""
    lse = reference_logsumexp(q, k, is_causal).float().to(DEVICE)
    return reference_attention(q, k, v, is_causal=is_causal).to(DEVICE, q.dtype), lse


OUTPUTS = {"dkdv_kernel": ("dk", "dv"), "dq_kernel": ("dq",)}     # each kernel's gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", [(1, 1, 16), (17, 17, 16), (100, 100, 32), (40, 70, 16), (70, 40, 64)])
def test_gradients_match_float64(exercise, Nq, Nk, D, is_causal, dtype, monkeypatch):
    """With one kernel written and the other still `pass`, the written one's gradients are checked on
    their own (the other launches as nothing), so the first pass can be right before the second is
    begun; the test then ends as not started, naming the kernel left."""
    unwritten = {name: kernel for name in OUTPUTS if (kernel := unwritten_under(getattr(exercise, name)))}
    if len(unwritten) == 1:
        (kernel,) = unwritten.values()
        monkeypatch.setattr(kernel, "launches_nothing", True)
    q = torch.randn(2, 2, Nq, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(2, 2, Nk, D, device=DEVICE, dtype=dtype) for _ in range(2))
    grad_out = torch.randn_like(q)
    out, lse = _forward(q, k, v, is_causal)
    grads = exercise.flash_backward(q, k, v, out, lse, grad_out, is_causal=is_causal)
    wants = reference_gradients(q, k, v, grad_out, is_causal=is_causal)
    for name, got, want in zip("qkv", grads, wants):
        assert got.shape == want.shape and got.dtype == dtype, f"d{name}: shape or dtype"
    checked = [what for name, outputs in OUTPUTS.items() if name not in unwritten for what in outputs]
    _check_all(grads, wants, TOL[dtype], (q, k, v, grad_out, is_causal), checked)
    for kernel in unwritten.values():      # one (with both unwritten, the launcher stopped at the first)
        right = " and ".join(f"d{what[1].upper()}" for what in checked)
        # flash_backward ran to its end, launching the written kernel: in progress
        kernel.refuse(f"{right} match float64 here; ", launcher_written=True)


def test_deterministic(exercise):
    """No atomics needed: each program owns its output tile, so two runs agree bit for bit."""
    q, k, v, grad_out = (torch.randn(1, 2, 70, 16, device=DEVICE) for _ in range(4))
    out, lse = _forward(q, k, v, True)
    first = exercise.flash_backward(q, k, v, out, lse, grad_out, is_causal=True)
    second = exercise.flash_backward(q, k, v, out, lse, grad_out, is_causal=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_causal_skips_tiles_above_the_diagonal(exercise):
    """Keys ≥ 128 are unseen by all 40 queries and hold NaN: both passes must skip their tiles."""
    q, grad_out = (torch.randn(1, 2, 40, 16, device=DEVICE) for _ in range(2))
    k, v = (torch.randn(1, 2, 300, 16, device=DEVICE) for _ in range(2))
    out, lse = _forward(q, k[:, :, :40], v[:, :, :40], True)
    k[:, :, 128:], v[:, :, 128:] = float("nan"), float("nan")
    dq, dk, dv = exercise.flash_backward(q, k, v, out, lse, grad_out, is_causal=True)
    require(torch.isfinite(dq).all(), "the dQ pass read key tiles that causal masking makes useless")
    require(torch.isfinite(dk).all() and torch.isfinite(dv).all(),
            "the dK/dV pass visited query blocks that cannot see its keys")
    require((dk[:, :, 40:] == 0).all() and (dv[:, :, 40:] == 0).all(), "keys no query sees get zero gradient")
    want = reference_gradients(q, k[:, :, :40], v[:, :, :40], grad_out, is_causal=True)
    _check_all((dq, dk[:, :, :40], dv[:, :, :40]), want, TOL[torch.float32])


class _LaunchRecorder:
    """Stands in for a kernel: records each ``kernel[grid](…)`` launch, then launches it."""

    def __init__(self, kernel, name, launched):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def record(*args, **kwargs):
            self.launched.append(self.name)
            return launch(*args, **kwargs)
        return record

    def __call__(self, *args, **kwargs):
        return self.kernel(*args, **kwargs)

    def __getattr__(self, name):          # .fn, .src, …: as the kernel has them
        return getattr(self.kernel, name)


def test_launches_both_kernels(exercise, monkeypatch):
    """Two passes, dK/dV then dQ, so that each output tile has exactly one writer."""
    launched = []
    for name in ("dkdv_kernel", "dq_kernel"):
        monkeypatch.setattr(exercise, name, _LaunchRecorder(getattr(exercise, name), name, launched))
    q, k, v, grad_out = (torch.randn(1, 2, 40, 16, device=DEVICE) for _ in range(4))
    out, lse = _forward(q, k, v, False)
    exercise.flash_backward(q, k, v, out, lse, grad_out)
    for name in ("dkdv_kernel", "dq_kernel"):
        assert name in launched, (
            f"flash_backward never launched `{name}` (launched: {launched or 'nothing'}). The backward is "
            "two passes: dkdv_kernel writes each dK/dV tile from one program, dq_kernel each dQ tile from "
            "one program. Accumulating dQ inside the dK/dV pass needs atomics, whose result on a GPU "
            "depends on the order the programs finish (not deterministic).")


def test_kernels_use_no_atomics(exercise):
    """Atomics look deterministic in Triton's interpreter, which runs one program at a time,
    so only the source can show them."""
    q, k, v, grad_out = (torch.randn(1, 1, 8, 16, device=DEVICE) for _ in range(4))
    exercise.flash_backward(q, k, v, *_forward(q, k, v, False), grad_out)   # a stub is "not started"
    source = inspect.getsource(exercise)
    atomics = [(token.string, token.start[0]) for token in tokenize.generate_tokens(io.StringIO(source).readline)
               if token.type == tokenize.NAME and token.string.startswith("atomic_")]
    assert not atomics, (
        f"{exercise.__name__} uses {', '.join(f'{name} (line {line})' for name, line in atomics)}. "
        "On a GPU, atomic adds of dQ terms make dQ's rounding depend on the order the programs finish "
        "(float addition is not associative), so two runs differ; Triton's interpreter runs programs "
        "one after another and cannot show it. Write dQ in its own pass, `dq_kernel`, one program "
        "per query block.")
