"""Exercise 04, reference answer: tiled backward with recomputation."""

import torch


def tiled_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, grad_out: torch.Tensor, is_causal: bool = False,
                             scale: float | None = None, block_m: int = 16,
                             block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of attention, recomputing P from the log-sum-exp."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    f = torch.float64 if q.dtype == torch.float64 else torch.float32
    q32, k32, v32, do32 = q.to(f), k.to(f), v.to(f), grad_out.to(f)
    delta = (do32 * out.to(f)).sum(-1)                          # D_i = rowsum(dO ∘ O)
    dq, dk, dv = torch.zeros_like(q32), torch.zeros_like(k32), torch.zeros_like(v32)
    for j in range(0, k.shape[-2], block_n):
        kj, vj = k32[..., j:j + block_n, :], v32[..., j:j + block_n, :]
        for i in range(0, q.shape[-2], block_m):
            qi, doi = q32[..., i:i + block_m, :], do32[..., i:i + block_m, :]
            if is_causal and j > i + qi.shape[-2] - 1:
                continue                                         # tile fully above the diagonal
            s = qi @ kj.transpose(-1, -2) * scale
            if is_causal:
                qi_idx = torch.arange(i, i + qi.shape[-2], device=q.device)[:, None]
                kj_idx = torch.arange(j, j + kj.shape[-2], device=q.device)[None, :]
                s = s.masked_fill(kj_idx > qi_idx, -torch.inf)
            p = torch.exp(s - lse[..., i:i + block_m, None])
            dv[..., j:j + block_n, :] += p.transpose(-1, -2) @ doi
            ds = p * (doi @ vj.transpose(-1, -2) - delta[..., i:i + block_m, None])
            dq[..., i:i + block_m, :] += ds @ kj * scale
            dk[..., j:j + block_n, :] += ds.transpose(-1, -2) @ qi * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
