"""Exercise 03b, reference answer: tiled attention forward."""

import torch


def tiled_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                            scale: float | None = None, block_m: int = 16,
                            block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention computed tile by tile with the online softmax."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    n_q, n_k = q.shape[-2], k.shape[-2]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=acc_dtype, device=q.device)
    for i in range(0, n_q, block_m):
        qi = q[..., i:i + block_m, :].to(acc_dtype) * scale
        rows = qi.shape[-2]
        m = torch.full(qi.shape[:-1], -torch.inf, dtype=acc_dtype, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(*qi.shape[:-1], v.shape[-1], dtype=acc_dtype, device=q.device)
        last_key = min(n_k, i + rows) if is_causal else n_k
        for j in range(0, last_key, block_n):
            s = qi @ k[..., j:j + block_n, :].to(acc_dtype).transpose(-1, -2)
            if is_causal:
                qi_idx = torch.arange(i, i + rows, device=q.device)[:, None]
                kj_idx = torch.arange(j, j + s.shape[-1], device=q.device)[None, :]
                s = s.masked_fill(kj_idx > qi_idx, -torch.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(-1)  # noqa: E741
            acc = acc * alpha[..., None] + p @ v[..., j:j + block_n, :].to(acc_dtype)
            m = m_new
        out[..., i:i + rows, :] = (acc / l[..., None]).to(q.dtype)
        lse[..., i:i + rows] = m + torch.log(l)
    return out, lse
