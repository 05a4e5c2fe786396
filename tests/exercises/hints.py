"""What the exercise tests add to a failure: the usual mistake, when the error has its signature."""

import ast
import inspect
import math
import textwrap

import torch

# what the exercise tests' torch.empty, empty_like and empty_strided fill new floating tensors with (root
# conftest.py's `exercise` fixture): exact in fp16, bf16 and fp32, and far from anything the exercises compute
UNWRITTEN = -4096.0


def known_mistake(err: float, signatures) -> str:
    """``"\\nhint: …"`` for the first ``(expected error, hint)`` whose expected relative error is
    within 1% of ``err`` (a mistake such as a flipped sign or a missing scale gives an exact
    error, whatever the inputs), else ``""``."""
    for expected, hint in signatures:
        if math.isfinite(err) and abs(err - expected) <= 0.01 * expected:
            return f"\nhint: {hint}"
    return ""


def require(condition, message: str) -> None:
    """``assert condition, message`` without pytest's rewriting: the message alone, not the message
    followed by the tensors of ``torch.isfinite(out).all()`` printed in full."""
    if not bool(condition):
        raise AssertionError(message)


def unwritten(t: torch.Tensor, what: str) -> str:
    """``"\\nhint: …"`` when entries of ``t`` still hold `UNWRITTEN`, the value the tests' ``torch.empty``
    gave the tensor: the kernel never stored there. Else ``""``."""
    if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()):
        return ""
    left = int((t == UNWRITTEN).sum())
    if not left:
        return ""
    held = f"{UNWRITTEN:g}, the value the tests fill new tensors from torch.empty with"
    if left == t.numel():
        return (f"\nhint: the kernel wrote nothing to {what}: every entry still holds {held}. Is the kernel's "
                f"body written (not `pass`), and does its tl.store write {what}?")
    return (f"\nhint: the kernel left {left} of the {t.numel()} entries of {what} unwritten: they still hold {held}. "
            "The grid, the offsets or the store's mask miss some.")


# the usual slips in a backward pass (exercises 04 and 06), each as the hint that names it
BACKWARD_MISTAKES = {
    "no D": "dS = P ∘ dP: the − D_i term is missing. dS = P ∘ (dP − D) with D_i = rowsum(dO_i ∘ O_i) "
            "(= Σ_j P_ij dP_ij, the second term of the softmax's Jacobian); dV = Pᵀ dO does not use dS, so it can "
            "be right while dQ and dK are not",
    "D flipped": "dS = P ∘ (D − dP) has the sign flipped: dS = P ∘ (dP − D)",
    "dQ unscaled": "dQ = dS K · scale: S = Q Kᵀ · scale, so the chain rule brings the scale to dQ (and to dK)",
    "dK unscaled": "dK = dSᵀ Q · scale: S = Q Kᵀ · scale, so the chain rule brings the scale to dK (and to dQ)",
    "dV scaled": "dV = Pᵀ dO has no softmax scale (it is inside P already); only dQ and dK take it",
    "dK scaled twice": "dK = dSᵀ Q · scale took the scale twice (scale², e.g. Q already scaled and then the product "
                       "scaled again): S = Q Kᵀ · scale brings it to dK once",
    "no key seen": "query 0's only key, its own (the diagonal), never reached P: P = 0, so dV = Pᵀ dO = 0 (with "
                   "N = 1, dQ = dK = 0 is right whatever P is, so only dV shows it). Two mistakes give this and N = 1 "
                   "cannot tell them apart: the causal mask also removing the diagonal (mask only kj > qi, not "
                   "kj >= qi), or the tile holding the diagonal skipped (skip a tile only when its first key j "
                   "comes after the query block's last row, j > i + rows − 1)",
    "diagonal masked": "the causal mask also removed the diagonal (kj >= qi): causal keeps key j ≤ query i, so "
                       "query i sees its own key. Mask only kj > qi",
}


def backward_mistake(name: str, got: torch.Tensor, q, k, v, grad_out, is_causal: bool, scale=None,
                     tol: float = 1e-4) -> str:
    """``"\\nhint: …"`` when ``got`` (d``name``, name in "qkv") is what one of `BACKWARD_MISTAKES` gives
    (computed here in float64, unbatched over the leading dimensions), within ``tol``; else ``""``."""
    q, k, v, grad_out = (t.detach().double().cpu() for t in (q, k, v, grad_out))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -torch.inf)
    p = torch.softmax(scores, -1)
    dp = grad_out @ v.transpose(-1, -2)
    delta = (grad_out * (p @ v)).sum(-1, keepdim=True)                 # D_i = rowsum(dO ∘ O)

    def grads(ds, q_scale=scale, k_scale=scale, v_scale=1.0):
        return {"q": ds @ k * q_scale, "k": ds.transpose(-1, -2) @ q * k_scale,
                "v": p.transpose(-1, -2) @ grad_out * v_scale}
    right = grads(p * (dp - delta))
    candidates = {"no D": grads(p * dp), "D flipped": grads(p * (delta - dp)),
                  "dQ unscaled": grads(p * (dp - delta), q_scale=1.0),
                  "dK unscaled": grads(p * (dp - delta), k_scale=1.0),
                  "dV scaled": grads(p * (dp - delta), v_scale=scale),
                  "dK scaled twice": grads(p * (dp - delta), k_scale=scale * scale)}
    if is_causal:     # P = exp(S − L) with the diagonal masked too: those entries 0, the rest as they were
        on_diagonal = torch.arange(q.shape[-2])[:, None] == torch.arange(k.shape[-2])[None, :]
        p_without = p.masked_fill(on_diagonal, 0.0)
        # every key masked (N = 1): the tile holding the diagonal skipped gives the same, so the hint names both
        mistake = "no key seen" if not p_without.any() else "diagonal masked"
        candidates[mistake] = {"q": (p_without * (dp - delta)) @ k * scale,
                               "k": (p_without * (dp - delta)).transpose(-1, -2) @ q * scale,
                               "v": p_without.transpose(-1, -2) @ grad_out}
    got = got.detach().double().cpu()
    for mistake, wrong in candidates.items():
        want = wrong[name]
        differs = (want - right[name]).norm() > 10 * tol * right[name].norm()
        if differs and (got - want).norm() <= tol * max(want.norm().item(), 1e-30):
            return f"\nhint: {BACKWARD_MISTAKES[mistake]}"
    return ""


def body_without_docstring(fn: ast.FunctionDef) -> list:
    """A function's statements after its docstring."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


def kernel_is_unwritten(jit_function) -> bool:
    """A ``@triton.jit`` function whose body (docstring aside) is still only the stub's ``pass``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(jit_function.fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    return all(isinstance(statement, ast.Pass) for statement in body_without_docstring(tree.body[0]))


class KernelNotWritten(NotImplementedError):
    """An exercise kernel launched while its body is still ``pass`` (conftest.py reports the test as
    not started, and the exercise as in progress when the learner's launcher made the launch, or
    when ``launcher_written`` says so: a test that checked the other kernels through it)."""

    launcher_written = False


class UnwrittenKernel:
    """An exercise's kernel whose body is still ``pass``: a Triton kernel cannot raise
    NotImplementedError as the other stubs do, so launching this one does, and the test is reported
    as "not started" instead of failing on an output nothing wrote. ``.kernel`` is what it wraps
    (the tests' `the_jit_function` unwraps it); ``kernel_for`` passes it through unchanged."""

    launches_nothing = False      # a test sets it (monkeypatch) to check another kernel's outputs alone

    def __init__(self, kernel, kernel_name: str, exercise_name: str):
        self.kernel, self._names = kernel, (kernel_name, exercise_name)

    def __getattr__(self, attr):                   # .fn, .src, … of the kernel underneath
        if attr == "kernel":                       # not yet set (copy, pickle): no recursion
            raise AttributeError(attr)
        return getattr(self.kernel, attr)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if not self.launches_nothing:
                self.refuse()
        return launch

    def refuse(self, before: str = "", launcher_written: bool = False):
        """Raise `KernelNotWritten` naming this kernel, after ``before`` (what the test found right)."""
        kernel_name, exercise_name = self._names
        error = KernelNotWritten(f"{before}{kernel_name}'s body is still the stub's `pass`: write it in "
                                 f"exercises/{exercise_name}.py")
        error.launcher_written = launcher_written
        raise error


def unwritten_under(kernel) -> "UnwrittenKernel | None":
    """The `UnwrittenKernel` under the tests' wrappers of ``kernel`` (each keeps what it wraps in
    ``.kernel``), or None when the kernel is written."""
    while kernel is not None and not isinstance(kernel, UnwrittenKernel):
        kernel = getattr(kernel, "kernel", None) if not isinstance(kernel, type) else None
    return kernel


def mark_unwritten_kernels(module, exercise_name: str) -> None:
    """Replaces each of ``module``'s own ``@triton.jit`` kernels (or the CPU's interpreted twin of one) whose
    body is still ``pass`` by an `UnwrittenKernel`."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return
    for attr, value in list(vars(module).items()):
        if isinstance(value, UnwrittenKernel):                  # marked by an earlier test (the module is cached)
            continue
        jit_function = getattr(value, "kernel", value)          # the CPU's interpreted twin wraps it
        if isinstance(jit_function, JITFunction) and getattr(jit_function.fn, "__module__", None) == module.__name__ \
                and kernel_is_unwritten(jit_function):
            setattr(module, attr, UnwrittenKernel(value, attr, exercise_name))
