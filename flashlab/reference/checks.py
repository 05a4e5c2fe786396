"""Input validation shared by every attention implementation in flashlab.

Every public attention function calls :func:`check_attention_inputs` first, so a bad
input fails the same way everywhere: a ``ValueError`` whose message names the argument,
says what was wrong and what to do instead. Nothing in flashlab returns silently wrong
numbers for an input it cannot handle.
"""

from __future__ import annotations

import math
import numbers

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def finite_number(value) -> bool:
    """A finite int or float, not a bool: what a ``scale`` may be (SDPA's and FlashAttention's take any)."""
    # comparisons, not math.isfinite: under torch.compile with dynamic=True a float argument is a
    # symbolic float, which math.isfinite cannot take (a comparison becomes a guard); NaN fails both
    return isinstance(value, (int, float)) and not isinstance(value, bool) and -math.inf < value < math.inf


def without_neg_views(*tensors):
    """The tensors with any negative view resolved: a view carrying PyTorch's negative bit
    (``z.conj().imag`` of a complex tensor is one) stores the values unnegated, and a Triton
    kernel reads the storage, so it would see the opposite sign. A copy only for such views;
    None passes through."""
    return tuple(t.resolve_neg() if t is not None and t.is_neg() else t for t in tensors)


def _fail(argument: str, problem: str, fix: str) -> None:
    raise ValueError(f"{argument}: {problem}. {fix}")


def check_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
    enable_gqa: bool = False,
    *,
    sdpa_semantics: bool = False,
    names: tuple[str, str, str] = ("q", "k", "v"),
) -> None:
    """Check q, k, v (and an optional mask) against the contract of
    ``torch.nn.functional.scaled_dot_product_attention``.

    Shapes: ``q (..., Nq, D)``, ``k (..., Nk, D)``, ``v (..., Nk, Dv)`` with identical
    leading (batch, head) dimensions. ``attn_mask`` must broadcast to ``(..., Nq, Nk)``;
    a boolean mask means "True takes part", a float mask is added to the scores.

    With ``enable_gqa`` (grouped-query attention), k and v may have fewer heads than q
    (dimension -3), as long as that number divides q's.

    ``sdpa_semantics`` (what `flashlab.attention` accepts, as SDPA does): zero-size
    dimensions; k and v batch dimensions that broadcast to q's; ``attn_mask`` together with
    ``is_causal`` on CPU tensors (both apply), where torch 2.13's SDPA takes it too (its
    CPU flash backend; on CUDA and in its math backend it raises).

    ``names`` are the caller's parameter names for q, k and v, which the messages use
    (`flashlab.attention` takes SDPA's ``query``, ``key``, ``value``).

    Raises:
        ValueError: naming the offending argument, the reason and the fix.
    """
    Q, K, V = names                      # the caller's parameter names, so the message names what was passed
    for name, t in ((Q, q), (K, k), (V, v)):
        if not isinstance(t, torch.Tensor):
            _fail(name, f"expected a torch.Tensor, got {type(t).__name__}",
                  "Pass a tensor of shape (..., N, D).")
        if t.is_nested:
            _fail(name, "is a nested tensor; the kernels take dense tensors",
                  "For sequences of different lengths pass them packed to flashlab.varlen_attention "
                  "(rows of every sequence with cu_seqlens), or pad them and pass an attn_mask.")
        if t.layout != torch.strided:
            _fail(name, f"has layout {t.layout}; the kernels take dense (strided) tensors",
                  f"Pass {name}.to_dense().")
        if t.dim() < 2:
            _fail(name, f"expected at least 2 dimensions (..., N, D), got shape {tuple(t.shape)}",
                  f"Add the sequence dimension, e.g. {name}.unsqueeze(0).")
        if t.dtype not in dtypes:
            _fail(name, f"dtype {t.dtype} is not supported here",
                  f"Use one of {', '.join(str(d) for d in dtypes)}, e.g. {name}.to(torch.float32).")
    if not (q.dim() == k.dim() == v.dim()):
        _fail(K, f"{Q}, {K} and {V} must have the same rank, got {Q} {tuple(q.shape)}, "
              f"{K} {tuple(k.shape)}, {V} {tuple(v.shape)}",
              "Give all three the layout (batch, heads, N, D).")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        bad, t = (K, k) if k.dtype != q.dtype else (V, v)
        _fail(bad, f"dtype {t.dtype} differs from {Q}'s {q.dtype}",
              f"Cast all three to one dtype, e.g. {bad}.to({Q}.dtype).")
    if k.device != q.device or v.device != q.device:
        bad, t = (K, k) if k.device != q.device else (V, v)
        _fail(bad, f"is on {t.device} but {Q} is on {q.device}",
              f"Move all three to one device, e.g. {bad}.to({Q}.device).")

    def batch_ok(t):   # dimensions before the heads: equal, or (SDPA) broadcasting to q's
        if t.shape[:-3] == q.shape[:-3]:
            return True
        try:
            return sdpa_semantics and torch.broadcast_shapes(t.shape[:-3], q.shape[:-3]) == q.shape[:-3]
        except RuntimeError:
            return False

    heads_ok = q.dim() < 3 or k.shape[-3] == q.shape[-3] or (
        enable_gqa and k.shape[-3] > 0 and q.shape[-3] % k.shape[-3] == 0)
    if q.dim() >= 3 and k.shape[:-2] == v.shape[:-2] and batch_ok(k) and heads_ok:
        pass  # with enable_gqa, each k/v head serves q.shape[-3] // k.shape[-3] q heads
    elif q.dim() >= 3 and k.shape[:-2] == v.shape[:-2] and batch_ok(k):     # only the heads disagree
        heads, heads_kv = q.shape[-3], k.shape[-3]
        divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        if enable_gqa:
            _fail(K, f"{heads_kv} heads do not divide {Q}'s {heads}",
                  f"With enable_gqa=True each {K}/{V} head serves an equal group of {Q} heads: give {K} and {V} "
                  f"a number of heads that divides {heads} ({divisors}).")
        elif sdpa_semantics and heads_kv and heads % heads_kv == 0:
            _fail(K, f"has {heads_kv} heads, {Q} {heads}",
                  f"For grouped-query attention pass enable_gqa=True (each {K}/{V} head then serves "
                  f"{heads // heads_kv} {Q} heads).")
        gqa = (f" (or one, which broadcasts; or, with enable_gqa=True, {K} and {V} a number that divides {Q}'s: "
               f"{divisors})")
        _fail(K, f"has {heads_kv} heads, {Q} {heads}",
              f"{Q}, {K} and {V} must have the same number of heads{gqa if sdpa_semantics else ''}.")
    elif q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        def fits(t):        # equal to q's, or (SDPA) broadcasting with it
            if t.shape[:-2] == q.shape[:-2]:
                return True
            try:
                torch.broadcast_shapes(t.shape[:-2], q.shape[:-2])
            except RuntimeError:
                return False
            return sdpa_semantics
        bad, t = (V, v) if fits(k) else (K, k)       # name the one that does not fit (k first)
        sdpa = (f", or broadcast against each other as in SDPA (each size equal or 1; with enable_gqa=True, {K} "
                f"and {V} may have a number of heads that divides {Q}'s)")
        _fail(bad, f"leading (batch, head) dimensions {tuple(t.shape[:-2])} differ from {Q}'s {tuple(q.shape[:-2])}",
              f"{Q}, {K} and {V} must share every dimension but the last two{sdpa if sdpa_semantics else ''}.")
    if k.shape[-1] != q.shape[-1]:
        _fail(K, f"head dimension {k.shape[-1]} differs from {Q}'s {q.shape[-1]}",
              f"{Q} and {K} must have the same last dimension (they are multiplied together).")
    if v.shape[-2] != k.shape[-2]:
        _fail(V, f"sequence length {v.shape[-2]} differs from {K}'s {k.shape[-2]}",
              f"{K} and {V} must hold one row per key.")
    for name, t in ((Q, q), (K, k), (V, v)):
        if not sdpa_semantics and (t.shape[-2] == 0 or t.shape[-1] == 0):
            _fail(name, f"has an empty dimension, shape {tuple(t.shape)}",
                  "Sequence length and head dimension must be at least 1.")
    if scale is not None:
        # SDPA takes any finite scale (0: every key weighted alike; negative: the scores flipped)
        number = finite_number(scale)
        if not number or (not sdpa_semantics and scale <= 0):
            kind = "finite" if sdpa_semantics else "positive"
            _fail("scale", f"expected a {kind} number or None, got {scale!r}", "Leave it as None for 1/sqrt(D).")
    if attn_mask is not None:
        if is_causal and not (sdpa_semantics and q.device.type == "cpu"):
            where = f" on {q.device.type}" if sdpa_semantics else ""
            _fail("attn_mask", f"was given together with is_causal=True{where}",
                  "Pass one or the other: fold the causal mask into attn_mask if you need both "
                  "(torch's SDPA refuses both on CUDA too; on CPU tensors flashlab.attention applies both).")
        if not isinstance(attn_mask, torch.Tensor):
            _fail("attn_mask", f"expected a torch.Tensor or None, got {type(attn_mask).__name__}",
                  "Pass a boolean (True = take part) or float (added to scores) tensor.")
        if attn_mask.is_nested or attn_mask.layout != torch.strided:
            kind = "a nested tensor" if attn_mask.is_nested else f"layout {attn_mask.layout}"
            _fail("attn_mask", f"is {kind}; the kernels read a dense (strided) mask",
                  "Pass attn_mask.to_dense() (a nested batch: pad it, and mask the padding).")
        # SDPA's rule: bool, the query's dtype, or float32 beside any query dtype (the kernels and the
        # PyTorch path add a float mask to the scores in float32, so it is never rounded to fp16/bf16)
        if attn_mask.dtype not in (torch.bool, q.dtype) and not (sdpa_semantics and attn_mask.dtype == torch.float32):
            also = ", float32" if sdpa_semantics else ""
            _fail("attn_mask", f"dtype {attn_mask.dtype} is neither bool{also} nor {Q}'s dtype {q.dtype}",
                  f"Use a boolean mask or attn_mask.to({q.dtype}).")
        if attn_mask.device != q.device:
            _fail("attn_mask", f"is on {attn_mask.device} but {Q} is on {q.device}",
                  f"Move it with attn_mask.to({Q}.device).")
        target = (*q.shape[:-2], q.shape[-2], k.shape[-2])
        try:
            shape = torch.broadcast_shapes(attn_mask.shape, target)
        except RuntimeError:
            shape = None
        if shape != torch.Size(target):
            _fail("attn_mask", f"shape {tuple(attn_mask.shape)} does not broadcast to "
                  f"(..., Nq, Nk) = {target}",
                  "Use size 1 for dimensions the mask shares, e.g. (B, 1, 1, Nk) for key padding.")


def check_window(window) -> None:
    """``window`` is None or ``(left, right)``: two integers ≥ −1 (−1: unbounded on that side)."""
    if window is not None and not (isinstance(window, (tuple, list)) and len(window) == 2 and all(
            isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= -1 for w in window)):
        _fail("window", f"expected (left, right) of integers ≥ −1, got {window!r}",
              "E.g. window=(4096, 0) with is_causal=True: each query sees itself and the 4096 keys before it; "
              "−1 = unbounded on that side, None = no window")


def check_softcap(softcap) -> float:
    """``softcap`` is None or 0 (none) or a positive finite number: the logits' soft cap,
    cap·tanh(x/cap) (Gemma 2's ``attn_logit_softcapping``). Returns it as a float, 0.0 for none."""
    if softcap is None:
        return 0.0
    if not (isinstance(softcap, numbers.Real) and not isinstance(softcap, bool) and math.isfinite(softcap)
            and softcap >= 0):
        _fail("softcap", f"expected a positive finite number (or None/0 for none), got {softcap!r}",
              "E.g. softcap=50.0, Gemma 2's attention logit cap: scores become 50·tanh(scores/50)")
    return float(softcap)


def default_scale(head_dim: int, scale: float | None) -> float:
    """The softmax temperature: ``scale`` if given, else ``1/sqrt(D)`` as in the paper
    (1 for D = 0, where every score is 0 whatever the scale)."""
    return float(scale) if scale is not None else (head_dim ** -0.5 if head_dim else 1.0)
