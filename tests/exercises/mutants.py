"""Mutation check of the exercise tests: each plausible wrong answer below is written into
a copy of the reference answer, placed in exercises/ of a temporary copy of the repository,
and that exercise's tests are run against it. Every mutant must be caught (some test
fails); the reference answer itself must pass. Not collected by pytest (no test_ prefix).

    python tests/exercises/mutants.py                    # every exercise, writes tests/exercises/MUTATIONS.md
    python tests/exercises/mutants.py ex03b_tiled_forward ex09_decoder_step   # only these, prints the table
    python tests/exercises/mutants.py -x …               # stop each run at its first failing test (faster)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]

# (exercise, the wrong answer in words, text of the reference answer, what replaces it); a
# mutant that changes several places gives tuples of texts and their replacements, in pairs
MUTANTS = [
    ("ex00_vector_add", "grid of n // block programs (the ragged tail is never written)",
     "(triton.cdiv(n, block),)", "(max(1, n // block),)"),
    ("ex00_vector_add", "grid of n // block programs (none at all when n < block)",
     "(triton.cdiv(n, block),)", "(n // block,)"),
    ("ex00_vector_add", "store without the mask", "tl.store(out_ptr + offsets, x + y, mask=inside)",
     "tl.store(out_ptr + offsets, x + y)"),
    ("ex00_vector_add", "subtracts instead of adds", "x + y, mask=inside", "x - y, mask=inside"),
    ("ex00_vector_add", "no check of y's shape", "    if y.shape != x.shape:\n", "    if False:\n"),
    ("ex01_naive_attention", "causal mask bottom-right aligned",
     ".tril()", ".tril(diagonal=n_keys - n_queries)"),
    ("ex01_naive_attention", "scores not scaled", "q, k) * scale", "q, k)"),
    ("ex01_naive_attention", "default scale 1/D instead of 1/√D", "q.shape[-1] ** -0.5", "q.shape[-1] ** -1.0"),
    ("ex01_naive_attention", "softmax over the query axis", "softmax(scores, dim=-1)", "softmax(scores, dim=-2)"),
    ("ex02_fused_softmax", "no row max subtracted", "e = tl.exp(x - m)", "e = tl.exp(x)"),
    ("ex02_fused_softmax", "padding columns loaded as 0, not −inf", 'other=-float("inf")', "other=0.0"),
    ("ex02_fused_softmax", "a fully −inf row gives NaN", '    m = tl.where(m == -float("inf"), 0.0, m)\n', ""),
    ("ex02_fused_softmax", "store without the mask", "y.to(y_ptr.dtype.element_ty), mask=inside)",
     "y.to(y_ptr.dtype.element_ty))"),
    ("ex03_online_softmax", "update forgets to rescale the old sum", "return m_new, l * torch.exp(m - s) +",
     "return m_new, l +"),
    ("ex03_online_softmax", "update: NaN when every value so far is −inf",
     "    s = _shift(m_new)\n    return m_new", "    s = m_new\n    return m_new"),
    ("ex03_online_softmax", "merge does not rescale the second state", "+ l_b * torch.exp(m_b - s)", "+ l_b"),
    ("ex03_online_softmax", "merge: NaN for two empty states", "    s = _shift(m)\n    return m, l_a",
     "    s = m\n    return m, l_a"),
    ("ex03b_tiled_forward", "causal, but never skips key blocks above the diagonal",
     "last_key = min(n_k, i + rows) if is_causal else n_k", "last_key = n_k"),
    ("ex03b_tiled_forward", "causal skip at Nq for every query block (not per block)",
     "last_key = min(n_k, i + rows) if is_causal else n_k", "last_key = min(n_k, n_q) if is_causal else n_k"),
    ("ex03b_tiled_forward", "causal key loop stopped at the query block's first row (right only if block_m ≤ block_n)",
     "last_key = min(n_k, i + rows) if is_causal", "last_key = min(n_k, i + 1) if is_causal"),
    ("ex03b_tiled_forward", "diagonal masked too (kj >= qi: query 0 sees no key)",
     "kj_idx > qi_idx", "kj_idx >= qi_idx"),
    ("ex03b_tiled_forward", "accumulator not rescaled by e^(m − m')", "acc = acc * alpha[..., None] +", "acc = acc +"),
    ("ex03b_tiled_forward", "lse in q's dtype", "lse = torch.empty(q.shape[:-1], dtype=acc_dtype",
     "lse = torch.empty(q.shape[:-1], dtype=q.dtype"),
    ("ex03b_tiled_forward", "whole rows of keys at once (an Nq-block × Nk tensor)",
     "for j in range(0, last_key, block_n):\n            s = qi @ k[..., j:j + block_n, :]",
     "for j in range(0, last_key, last_key):\n            block_n = last_key\n"
     "            s = qi @ k[..., j:j + block_n, :]"),
    ("ex04_tiled_backward", "dS without D_i", "- delta[..., i:i + block_m, None])", ")"),
    ("ex04_tiled_backward", "dK without the scale", "ds.transpose(-1, -2) @ qi * scale", "ds.transpose(-1, -2) @ qi"),
    ("ex04_tiled_backward", "P from its own softmax, not from the given lse",
     "p = torch.exp(s - lse[..., i:i + block_m, None])", "p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))"),
    ("ex04_tiled_backward", "causal tiles skipped but the diagonal tile not masked",
     "                s = s.masked_fill(kj_idx > qi_idx, -torch.inf)\n", "                pass\n"),
    ("ex04_tiled_backward", "causal skip from the query block's first row (k0 > q0), not its last",
     "if is_causal and j > i + qi.shape[-2] - 1:", "if is_causal and j > i:"),
    ("ex04_tiled_backward", "causal skip one tile early (≥ the last row instead of >)",
     "if is_causal and j > i + qi.shape[-2] - 1:", "if is_causal and j >= i + qi.shape[-2] - 1:"),
    ("ex04_tiled_backward", "gradients returned in float32", "return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)",
     "return dq.float(), dk.float(), dv.float()"),
    ("ex05_flash_forward", "no running max (e^S overflows)", "m_new = tl.maximum(m_i, tl.max(s, 1))",
     "m_new = tl.zeros([BLOCK_M], tl.float32)"),
    ("ex05_flash_forward", "lse in log base 2", "m_i + tl.log(l_i)", "m_i + tl.log2(l_i)"),
    ("ex05_flash_forward", "lse in the kernel's base-2 units (L·log2 e)", "m_i + tl.log(l_i))",
     "(m_i + tl.log(l_i)) * 1.4426950408889634)"),
    ("ex05_flash_forward", "lse without the running max (log l)", "m_i + tl.log(l_i))", "tl.log(l_i))"),
    ("ex05_flash_forward", "accumulator not rescaled", "acc = acc * alpha[:, None] +", "acc = acc +"),
    ("ex05_flash_forward", "scale ignored", "scale = 1.0 / math.sqrt(D) if scale is None else scale",
     "scale = 1.0 / math.sqrt(D)"),
    ("ex05_flash_forward", "no error for N not a multiple of BLOCK", "    if N % BLOCK:\n", "    if False:\n"),
    ("ex05b_causal_ragged", "causal, but never skips key blocks",
     "hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)", "hi = n_k"),
    ("ex05b_causal_ragged", "causal stop at Nq for every query block (not per block)",
     "hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)", "hi = tl.minimum(n_k, n_q)"),
    ("ex05b_causal_ragged", "keys past Nk not set to −inf", 's = tl.where(valid, s, -float("inf"))', "s = s"),
    ("ex05b_causal_ragged", "causal mask excludes the diagonal", "cols[None, :] <= offs_m[:, None]",
     "cols[None, :] < offs_m[:, None]"),
    ("ex06_flash_backward", "dK not multiplied by the scale", "(dk * scale).to(DK.dtype.element_ty)",
     "dk.to(DK.dtype.element_ty)"),
    ("ex06_flash_backward", "dS sign flipped, P ∘ (D − dP) (both passes)", "ds = p * (dp - delta[:, None])",
     "ds = p * (delta[:, None] - dp)"),
    ("ex06_flash_backward", "dQ by atomic adds in the dK/dV pass, dq_kernel never launched",
     ("def dkdv_kernel(Q, K, V, DO, L, DELTA, DK, DV, n_q,",
      "        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)             # dK_j += dSᵀ Q_i\n",
      "    dq, dk, dv = torch.empty_like(q),",
      "dk, dv, n_q, n_k, scale, **meta)\n    kernel_for(dq_kernel, q.device)[(triton.cdiv(n_q, BLOCK), B * H)](\n"
      "        q, k, v, grad_out, lse, delta, dq, n_q, n_k, scale, **meta)\n    return dq, dk, dv"),
     ("def dkdv_kernel(Q, K, V, DO, L, DELTA, DK, DV, DQ, n_q,",
      "        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)             # dK_j += dSᵀ Q_i\n"
      "        tl.atomic_add(DQ + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],\n"
      "                      tl.dot(ds.to(k.dtype), k) * scale, mask=(offs_m < n_q)[:, None])\n",
      "    dq, dk, dv = torch.zeros(q.shape, dtype=torch.float32, device=q.device),",
      "dk, dv, dq, n_q, n_k, scale, **meta)\n    return dq.to(q.dtype), dk, dv")),
    ("ex06_flash_backward", "dS without D_i (both passes)", "ds = p * (dp - delta[:, None])", "ds = p * dp"),
    ("ex06_flash_backward", "dK/dV pass visits every query block (causal)",
     "lo = (start_n // BLOCK_M) * BLOCK_M", "lo = 0"),
    ("ex06_flash_backward", "dQ pass visits every key block (causal)",
     "hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)", "hi = n_k"),
    ("ex06_flash_backward", "dQ pass's causal end with start_m read as a row offset (it is the block's index)",
     "hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)", "hi = tl.minimum(n_k, start_m + BLOCK_M)"),
    ("ex07_autotuner", "NaN errors accepted (error > tolerance)", "if not error <= tolerance:",
     "if error > tolerance:"),
    ("ex07_autotuner", "error bound exclusive (error < tolerance)", "if not error <= tolerance:",
     "if not error < tolerance:"),
    ("ex07_autotuner", "no margin: the fastest always replaces the default",
     "if default in times and not times[best] < margin * times[default]:", "if False:"),
    ("ex07_autotuner", "margin inclusive (a tie at margin × default replaces it)",
     "not times[best] < margin * times[default]", "not times[best] <= margin * times[default]"),
    ("ex07_autotuner", "margin applied against a default that failed",
     "if default in times and not times[best]", "if not times[best]"),
    ("ex08_loss_scaler", "scale grows one step late", "if growth_tracker == growth_interval:",
     "if growth_tracker > growth_interval:"),
    ("ex08_loss_scaler", "scale grows one step early", "if growth_tracker == growth_interval:",
     "if growth_tracker == growth_interval - 1:"),
    ("ex08_loss_scaler", "unscale multiplies by the scale", "p.grad.mul_(inv)", "p.grad.mul_(scale)"),
    ("ex08_loss_scaler", "steps even when a gradient overflowed", "    if not found_inf:\n        optimizer.step()",
     "    if True:\n        optimizer.step()"),
    ("ex08_loss_scaler", "NaN gradients not detected", "not bool(torch.isfinite(p.grad).all())",
     "bool(torch.isinf(p.grad).any())"),
    ("ex08_loss_scaler", "state's growth_interval ignored (update_scale's default)",
     'state.get("growth_interval", 2000))', "2000)"),
    ("ex08_loss_scaler", "state's backoff_factor ignored (update_scale's default)",
     'state.get("backoff_factor", 0.5),', "0.5,"),
    ("ex08b_autocast_step", "clips before unscaling",
     "        scaler.unscale_(optimizer)" + " " * 34 + "# before clipping: clip true gradients\n", ""),
    ("ex08b_autocast_step", "never clips (max norm inf)", "clip_grad_norm_(model.parameters(), grad_clip)",
     'clip_grad_norm_(model.parameters(), float("inf"))'),
    ("ex08b_autocast_step", "gradients not cleared after the step", "    optimizer.zero_grad(set_to_none=True)\n", ""),
    ("ex08b_autocast_step", "steps on inf without a scaler", "    elif not skipped:\n", "    else:\n"),
    ("ex08b_autocast_step", "no autocast for bf16-mixed", '"bf16-mixed": torch.bfloat16', '"bf16-mixed": None'),
    ("ex08b_autocast_step", "no error for 16-mixed without a scaler",
     '    if precision == "16-mixed" and scaler is None:\n', "    if False:\n"),
    ("ex09_decoder_step", "glimpse masks the unvisited cities instead", "masked_fill(visited[:, None, None, :]",
     "masked_fill(~visited[:, None, None, :]"),
    ("ex09_decoder_step", "glimpse without the mask",
     '    scores = scores.masked_fill(visited[:, None, None, :], float("-inf"))                # visited: weight 0\n',
     ""),
    ("ex09_decoder_step", "glimpse scaled by 1/√n (cities) instead of 1/√d",
     "/ math.sqrt(query.shape[-1])", "/ math.sqrt(keys.shape[-2])"),
    ("ex09_decoder_step", "pointer without the tanh clip", "(tanh_clip * torch.tanh(logits))", "logits"),
    ("ex09_decoder_step", "pointer returns probabilities, not log-probabilities",
     "torch.log_softmax(logits.float(), dim=-1)", "torch.softmax(logits.float(), dim=-1)"),
    ("ex09b_rollout_baseline", "population standard deviation (divisor n)", "sd = d.std().item()",
     "sd = d.std(correction=0).item()"),
    ("ex09b_rollout_baseline", "two-sided p-value", "return t, student_t_cdf(t, n - 1)",
     "return t, 2 * min(student_t_cdf(t, n - 1), 1 - student_t_cdf(t, n - 1))"),
    ("ex09b_rollout_baseline", "n degrees of freedom instead of n − 1", "student_t_cdf(t, n - 1)",
     "student_t_cdf(t, n)"),
    ("ex09b_rollout_baseline", "statistics in the inputs' dtype", "d = (a - b).double()", "d = a - b"),
    ("ex09b_rollout_baseline", "p = 0 for identical samples", "if d.mean() < 0 else", "if d.mean() <= 0 else"),
    ("ex10_split_kv_merge", "one maximum over every row instead of one per row", "m = lse_parts.amax(dim=0)",
     "m = lse_parts.max()"),
    ("ex10_split_kv_merge", "no maximum subtracted", "w = torch.exp(lse_parts - shift)", "w = torch.exp(lse_parts)"),
    ("ex10_split_kv_merge", "log-sum-exp without the shift added back", "return o, shift + torch.log(total)",
     "return o, torch.log(total)"),
    ("ex10_split_kv_merge", "no maximum at all (w = exp(L_s), L = log Σ w)",
     ("w = torch.exp(lse_parts - shift)", "return o, shift + torch.log(total)"),
     ("w = torch.exp(lse_parts)", "return o, torch.log(total)")),
    ("ex10_split_kv_merge", "rows with no key: m = −inf subtracted (NaN)",
     "shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)", "shift = m"),
    ("ex10_split_kv_merge", "outputs in float32 whatever the inputs' dtype", "return o, shift + torch.log(total)",
     "return o.float(), (shift + torch.log(total)).float()"),
    ("ex10b_packing_windows", "offsets without the leading 0", "    offsets = [0]\n", "    offsets = []\n"),
    ("ex10b_packing_windows", "the last key one short (no + 1)", "last_query + shift + right + 1)",
     "last_query + shift + right)"),
    ("ex10b_packing_windows", "window not aligned to the end of the keys", "    shift = k_len - q_len\n",
     "    shift = 0\n"),
    ("ex10b_packing_windows", "first tile not rounded down to a tile start", "range(lo // block_n * block_n, hi",
     "range(lo, hi"),
    ("ex10b_packing_windows", "every (query, key) pair tested (brute force, not O(1))", "    shift = k_len - q_len\n",
     "    shift = k_len - q_len\n    return sorted({j // block_n * block_n for i in range(first_query, last_query + 1)"
     " for j in range(k_len) if (left < 0 or j >= i + shift - left) and (right < 0 or j <= i + shift + right)})\n"),
    # from a learner's trial of exercises 00-04 (2026-12-05)
    ("ex03b_tiled_forward", "K scaled before the loops, never skips key blocks",
     ('    for i in range(0, n_q, block_m):\n', 'qi = q[..., i:i + block_m, :].to(acc_dtype) * scale',
      's = qi @ k[..., j:j + block_n, :].to(acc_dtype).transpose(-1, -2)',
      'last_key = min(n_k, i + rows) if is_causal else n_k'),
     ('    ks = k.to(acc_dtype) * scale\n    for i in range(0, n_q, block_m):\n',
      'qi = q[..., i:i + block_m, :].to(acc_dtype)',
      's = qi @ ks[..., j:j + block_n, :].transpose(-1, -2)', 'last_key = n_k')),
    ("ex03b_tiled_forward", "pre-transposed K, skip at Nq for every query block",
     ('    for i in range(0, n_q, block_m):\n', 's = qi @ k[..., j:j + block_n, :].to(acc_dtype).transpose(-1, -2)',
      'last_key = min(n_k, i + rows) if is_causal else n_k'),
     ('    kt = k.transpose(-1, -2).contiguous()\n    for i in range(0, n_q, block_m):\n',
      's = qi @ kt[..., :, j:j + block_n].to(acc_dtype)', 'last_key = min(n_k, n_q) if is_causal else n_k')),
    ("ex03b_tiled_forward", "scale ignored", "scale = q.shape[-1] ** -0.5 if scale is None else scale",
     "scale = q.shape[-1] ** -0.5"),
    ("ex03b_tiled_forward", "output allocated like q (width D, not Dv)",
     "out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)", "out = torch.empty_like(q)"),
    ("ex03b_tiled_forward", "accumulator of width D, not Dv", "acc = torch.zeros(*qi.shape[:-1], v.shape[-1]",
     "acc = torch.zeros(*qi.shape[:-1], qi.shape[-1]"),
    ("ex03b_tiled_forward", "accumulates in q's dtype (fp16), lse in float32",
     ("acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32",
      "lse = torch.empty(q.shape[:-1], dtype=acc_dtype"),
     ("acc_dtype = q.dtype",
      "lse = torch.empty(q.shape[:-1], dtype=torch.float64 if q.dtype == torch.float64 else torch.float32")),
    ("ex04_tiled_backward", "scale ignored", "scale = q.shape[-1] ** -0.5 if scale is None else scale",
     "scale = q.shape[-1] ** -0.5"),
    ("ex00_vector_add", "loads without the mask (store masked)",
     ("x = tl.load(x_ptr + offsets, mask=inside)", "y = tl.load(y_ptr + offsets, mask=inside)"),
     ("x = tl.load(x_ptr + offsets)", "y = tl.load(y_ptr + offsets)")),
    ("ex00_vector_add", "x's load without the mask (y's and the store masked)",
     "x = tl.load(x_ptr + offsets, mask=inside)", "x = tl.load(x_ptr + offsets)"),
    ("ex00_vector_add", "y's load without the mask (x's and the store masked)",
     "y = tl.load(y_ptr + offsets, mask=inside)", "y = tl.load(y_ptr + offsets)"),
    ("ex00_vector_add", "kernel launched directly (add_kernel[grid]), not through kernel_for",
     "kernel_for(add_kernel, x.device)[", "add_kernel["),
    ("ex02_fused_softmax", "y's row stride taken from x", "x.stride(0), out.stride(0)", "x.stride(0), x.stride(0)"),
    ("ex02_fused_softmax", "kernel launched directly, not through kernel_for", "kernel_for(softmax_kernel, x.device)[",
     "softmax_kernel["),
    ("ex02_fused_softmax", "load without the mask",
     'x_ptr + row * x_row_stride + cols, mask=inside, other=-float("inf"))', "x_ptr + row * x_row_stride + cols)"),
    ("ex01_naive_attention", "softmax without the max subtracted", "probabilities = torch.softmax(scores, dim=-1)",
     "probabilities = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)"),
    ("ex03_online_softmax", "update: rescale inverted, l·exp(m' − m)", "return m_new, l * torch.exp(m - s) +",
     "return m_new, l * torch.exp(s - m) +"),
    # from a learner's trial of exercises 05-10b
    ("ex03b_tiled_forward", "running max starts at 0, not −inf",
     "m = torch.full(qi.shape[:-1], -torch.inf, dtype=acc_dtype, device=q.device)",
     "m = torch.zeros(qi.shape[:-1], dtype=acc_dtype, device=q.device)"),
    ("ex05_flash_forward", "running max starts at 0 (tl.zeros), not −inf",
     'm_i = tl.full([BLOCK_M], -float("inf"), tl.float32)', "m_i = tl.zeros([BLOCK_M], tl.float32)"),
    ("ex05b_causal_ragged", "running max starts at 0 (tl.zeros), not −inf",
     'm_i = tl.full([BLOCK_M], -float("inf"), tl.float32)', "m_i = tl.zeros([BLOCK_M], tl.float32)"),
    ("ex06_flash_backward", "dV multiplied by the scale like dK", "dv.to(DV.dtype.element_ty), mask=kv_ok)",
     "(dv * scale).to(DV.dtype.element_ty), mask=kv_ok)"),
    ("ex07_autotuner", "margin taken as an amount (default − (1 − margin)), not a factor",
     "not times[best] < margin * times[default]", "not times[best] < times[default] - (1 - margin)"),
    ("ex08_loss_scaler", "scaled_step does not check the loss (only the gradients)",
     " or not math.isfinite(loss.item())", ""),
    ("ex08b_autocast_step", "never reports skipped with a scaler (16-mixed)",
     "skipped = not (math.isfinite(norm)", "skipped = scaler is None and not (math.isfinite(norm)"),
    ("ex09_decoder_step", "pointer masks before the tanh (visited cities get −C, not −inf)",
     '(tanh_clip * torch.tanh(logits)).masked_fill(visited, float("-inf"))',
     'tanh_clip * torch.tanh(logits.masked_fill(visited, float("-inf")))'),
    ("ex10_split_kv_merge", "torch.softmax over the splits, all −inf rows not guarded (NaN)",
     ("    m = lse_parts.amax(dim=0)", "    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)",
      "    w = torch.exp(lse_parts - shift)", "    total = w.sum(dim=0)\n",
      "    o = (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, 1.0)[..., None]",
      "    return o, shift + torch.log(total)"),
     ("    w = torch.softmax(lse_parts, 0)", "", "", "", "    o = (w[..., None] * o_parts).sum(0)",
      "    return o, torch.logsumexp(lse_parts, 0)")),
    # from a second learner's trial of 05-10b (2026-12-06): the hints these get are the point
    ("ex05_flash_forward", "grid one query block short (the last block's O never written)",
     "[(N // BLOCK, B * H)]", "[(max(1, N // BLOCK - 1), B * H)]"),
    ("ex05b_causal_ragged", "diagonal excluded and no empty-row guards (row 0 sees no key: NaN)",
     ("cols[None, :] <= offs_m[:, None]", 'm_safe = tl.where(m_new == -float("inf"), 0.0, m_new)',
      "l_safe = tl.where(l_i > 0, l_i, 1.0)"),
     ("cols[None, :] < offs_m[:, None]", "m_safe = m_new", "l_safe = l_i")),
    ("ex05b_causal_ragged", "V loaded without the key mask (reads past Nk)",
     "v = tl.load(V + kv, mask=col_ok[:, None], other=0.0)", "v = tl.load(V + kv)"),
    ("ex05b_causal_ragged", "O stored without the row mask (writes past Nq)",
     "(acc / l_safe[:, None]).to(O.dtype.element_ty),\n             mask=row_ok[:, None])",
     "(acc / l_safe[:, None]).to(O.dtype.element_ty))"),
    ("ex05b_causal_ragged", "L stored without the row mask (writes past Nq)",
     "m_i + tl.log(l_safe), mask=row_ok)", "m_i + tl.log(l_safe))"),
    # from a third learner's trial (2026-12-06), for their hints: the diagonal excluded used to be sent to dV
    # (at Nk = 1, dQ = dK = 0 for any P); the others got a bare relative error
    ("ex06_flash_backward", "causal mask excludes the diagonal (key j < query i)",
     "valid & (offs_n[None, :] <= offs_m[:, None])", "valid & (offs_n[None, :] < offs_m[:, None])"),
    ("ex06_flash_backward", "dQ pass's causal loop stops before the diagonal block",
     "hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)", "hi = tl.minimum(n_k, start_m * BLOCK_M)"),
    ("ex09_decoder_step", "glimpse scaled by 1/d instead of 1/√d", "keys) / math.sqrt(query.shape[-1])",
     "keys) / query.shape[-1]"),
    ("ex09_decoder_step", "pointer scaled by 1/d instead of 1/√d", "logit_keys) / math.sqrt(glimpse.shape[-1])",
     "logit_keys) / glimpse.shape[-1]"),
    # from a learner's trial of 00-04 (2026-12-06), for their hints
    ("ex01_naive_attention", "masked scores multiplied by the mask (0, not −inf)",
     'scores = scores.masked_fill(~keep, float("-inf"))', "scores = scores * keep"),
    ("ex02_fused_softmax", "y's rows stepped by x_row_stride", "row * y_row_stride", "row * x_row_stride"),
    # from a learner's trial: ex04's N = 1 causal case failed without a hint
    ("ex04_tiled_backward", "diagonal masked too (kj >= qi: with N = 1, P = 0 and dV = 0)",
     "kj_idx > qi_idx", "kj_idx >= qi_idx"),
    ("ex10_split_kv_merge", "O the plain mean of the splits' O_s (no weights)",
     "    o = (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, 1.0)[..., None]",
     "    o = o_parts.mean(dim=0)"),
    # L alone wrong (O right): the hint names L's formula
    ("ex10_split_kv_merge", "L = m alone (log Σ_s w_s left out)", "return o, shift + torch.log(total)",
     "return o, shift"),
    # from a fifth learner's trial of 05-10, for their hints (each used to get the rescale hint, a misleading one
    # or none)
    ("ex05_flash_forward", "O not divided by ℓ", "(acc / l_i[:, None]).to(O.dtype.element_ty)",
     "acc.to(O.dtype.element_ty)"),
    ("ex05_flash_forward", "ℓ not rescaled by α (the accumulator is)", "l_i = l_i * alpha + tl.sum(p, 1)",
     "l_i = l_i + tl.sum(p, 1)"),
    ("ex05_flash_forward", "α's sign flipped, e^(m' − m)", "alpha = tl.exp(m_i - m_new)",
     "alpha = tl.exp(m_new - m_i)"),
    ("ex05_flash_forward", "P not shifted by the running max, P̃ = e^S", "p = tl.exp(s - m_new[:, None])",
     "p = tl.exp(s)"),
    ("ex05_flash_forward", "K/V loaded at the query block's rows (offs_m), not start_n + offs_n",
     "kv = base + (start_n + offs_n)[:, None]", "kv = base + offs_m[:, None]"),
    ("ex05_flash_forward", "K/V offsets not moved by the loop (rows offs_n of every block)",
     "kv = base + (start_n + offs_n)[:, None]", "kv = base + offs_n[:, None]"),
    ("ex05_flash_forward", "ℓ summed over the wrong axis (tl.sum(p, 0))", "l_i = l_i * alpha + tl.sum(p, 1)",
     "l_i = l_i * alpha + tl.sum(p, 0)"),
    ("ex05_flash_forward", "L mixes log bases, m + ln(ℓ)·ln 2", "m_i + tl.log(l_i))",
     "m_i + tl.log(l_i) * 0.6931471805599453)"),
    ("ex05b_causal_ragged", "causal loop bound one block short (the diagonal block never read)",
     "hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)", "hi = tl.minimum(n_k, start_m * BLOCK_M)"),
    ("ex10_split_kv_merge", "O = Σ_s w_s O_s, not divided by Σ_s w_s",
     "    o = (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, 1.0)[..., None]",
     "    o = (w[..., None] * o_parts).sum(dim=0)"),
    ("ex10_split_kv_merge", "O divided by the number of splits, not by Σ_s w_s",
     "    o = (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, 1.0)[..., None]",
     "    o = (w[..., None] * o_parts).sum(dim=0) / o_parts.shape[0]"),
    ("ex10_split_kv_merge", "O of the split with the largest L_s alone",
     "    o = (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, 1.0)[..., None]",
     "    o = o_parts.gather(0, lse_parts.argmax(dim=0)[None, ..., None].expand(1, *o_parts.shape[1:]))[0]"),
    ("ex11_mbarrier_ring", "producer's phase not flipped (waits on 'empty' for the round's phase)",
     "return slot, phase ^ 1", "return slot, phase"),
    ("ex11_mbarrier_ring", "consumer's phase flipped too", "return slot, phase  ", "return slot, phase ^ 1  "),
    ("ex11_mbarrier_ring", "slot = i // S (the round, not the slot)", "return i % stages, (i // stages) % 2",
     "return i // stages, (i // stages) % 2"),
    ("ex11_mbarrier_ring", "producer's round one iteration ahead ((i + 1) // S)",
     "    slot, phase = slot_and_phase(i, stages)\n    return slot, phase ^ 1",
     "    return i % stages, ((i + 1) // stages) % 2 ^ 1"),
    ("ex11_mbarrier_ring", "phase bit flipped every iteration (i mod 2)", "return i % stages, (i // stages) % 2",
     "return i % stages, i % 2"),
    ("ex11_mbarrier_ring", "phase = the round i // S (not a bit)", "return i % stages, (i // stages) % 2",
     "return i % stages, i // stages"),
    # from a fifth learner's trial (00-04), for their hints: each used to get no hint or another mistake's
    ("ex03_online_softmax", "merge keeps the first side's max (m = m_a, not max(m_a, m_b))",
     "    m = torch.maximum(m_a, m_b)\n", "    m = m_a\n"),
    ("ex03b_tiled_forward", "max not subtracted in the tile (P̃ = exp(S)), l and acc still rescaled",
     "p = torch.exp(s - m_new[..., None])", "p = torch.exp(s)"),
    ("ex03b_tiled_forward", "lse = log l (the running max not added back)", "lse[..., i:i + rows] = m + torch.log(l)",
     "lse[..., i:i + rows] = torch.log(l)"),
    ("ex04_tiled_backward", "dK scaled twice (dSᵀ Q · scale²)", "ds.transpose(-1, -2) @ qi * scale",
     "ds.transpose(-1, -2) @ qi * scale * scale"),
]


def _environment(repo: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHLAB_IMPL", "CI")}
    env["PYTHONPATH"] = str(repo)
    return env


FIRST_FAILURE: list[str] = []


def _run(repo: Path, exercise: str) -> tuple[int, list[str], float]:
    """Runs exercise's tests against exercises/ in ``repo``; returns rc, failed test names, seconds."""
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                             "--impl=exercises", *FIRST_FAILURE, f"tests/exercises/test_{exercise}.py"],
                            cwd=repo, capture_output=True, text=True, env=_environment(repo))
    failed = sorted({re.sub(r"\[.*", "", m) for m in re.findall(r"^FAILED \S+::(\S+)", result.stdout, re.M)})
    return result.returncode, failed, time.monotonic() - start


def main(only: list[str]) -> int:
    chosen = [m for m in MUTANTS if not only or m[0] in only]
    rows, problems = [], []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "results",
                                                                  "checkpoints"))
        for exercise in sorted({m[0] for m in chosen}):
            answer = (ROOT / "solutions" / f"{exercise}.py").read_text()
            target = repo / "exercises" / f"{exercise}.py"
            target.write_text(answer)
            rc, failed, seconds = _run(repo, exercise)
            if rc != 0:
                problems.append(f"{exercise}: the reference answer fails {failed}")
            print(f"{exercise}: reference answer {'passes' if rc == 0 else 'FAILS'} ({seconds:.0f} s)", flush=True)
            for _, wrong, old, new in (m for m in chosen if m[0] == exercise):
                pairs = list(zip(old, new)) if isinstance(old, tuple) else [(old, new)]
                if any(o not in answer for o, _ in pairs):
                    problems.append(f"{exercise}: mutant '{wrong}' does not apply")
                    continue
                mutated = answer
                for o, n in pairs:
                    mutated = mutated.replace(o, n)
                target.write_text(mutated)
                rc, failed, seconds = _run(repo, exercise)
                caught = ", ".join(f"`{f}`" for f in failed) if failed else (
                    "**not caught**" if rc == 0 else f"the test process dies (exit {rc})")
                if rc == 0:
                    problems.append(f"{exercise}: mutant '{wrong}' passes every test")
                rows.append(f"| {exercise} | {wrong} | {caught} |")
                print(rows[-1], flush=True)
            target.write_text((ROOT / "exercises" / f"{exercise}.py").read_text())
    table = "\n".join(["| exercise | wrong answer | tests that fail |", "|---|---|---|", *rows])
    if not only:
        # the prose above the table (what the rows mean, answers that must pass) is kept as written
        path = ROOT / "tests" / "exercises" / "MUTATIONS.md"
        old = path.read_text() if path.exists() else ""
        prose = old[:old.index("| exercise |")] if "| exercise |" in old else (
            "# Mutation check of the exercise tests\n\n"
            "Each row is a plausible wrong answer written into a copy of the reference answer and run\n"
            "against that exercise's tests (`python tests/exercises/mutants.py` regenerates the table).\n\n")
        path.write_text(prose + table + "\n")
    print("\n" + table)
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if "-x" in args:
        args.remove("-x")
        FIRST_FAILURE.append("-x")
    sys.exit(main(args))
