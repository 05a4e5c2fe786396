"""Gradients of query rows masked everywhere with finfo.min (transformers' padding value), flashlab
beside each SDPA backend, against two float64 references (2026-12-06).

Such a row's scores are all finfo.min + q·k, and q·k is absorbed: every backend's forward averages V.
The gradients differ. PyTorch's math backend differentiates softmax as composed: the row's weights are
1/Nk each. Fused kernels that keep only the log-sum-exp L = m + log(Nk) per row lose log(Nk) at that
magnitude, so recomputing P = exp(S − L) gives weights of 1 each: their dq, dk and dv are Nk times the
math backend's for that row. Run: PYTHONPATH=. python -m measurements.masked_rows_grad_check [OUT.txt]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlab


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def case(n, dtype, device):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, dtype=dtype, device=device) for _ in range(3))
    mask = torch.zeros(1, 1, n, n, dtype=dtype, device=device)
    mask[..., :3, :] = torch.finfo(dtype).min        # rows 0-2: every key masked
    mask[..., 5, 2:] = torch.finfo(dtype).min        # row 5 sees keys 0 and 1
    grad = torch.randn(1, 2, n, 16, dtype=dtype, device=device)
    return q, k, v, mask, grad


def grads(fn, q, k, v, mask, grad):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, mask)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def main():
    lines = []
    say = lambda s: (print(s), lines.append(s))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    say(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}; torch {torch.__version__}")
    for n in (9, 130):
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v, mask, grad = case(n, dtype, device)
            args64 = [t.double().cpu() for t in (q, k, v, mask, grad)]
            with sdpa_kernel(SDPBackend.MATH):
                math64 = grads(lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3]), *args64)
            refs = {"float64 math": math64}
            try:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    refs["float64 CPU flash"] = grads(
                        lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3]), *args64)
            except RuntimeError as e:
                say(f"  float64 CPU flash refused: {str(e).splitlines()[0][:80]}")
            runs = {"flashlab": grads(lambda q, k, v, m: flashlab.attention(q, k, v, attn_mask=m),
                                      q, k, v, mask, grad)}
            backends = {"SDPA default": None, "math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION}
            for name, backend in backends.items():
                try:
                    if backend is None:
                        runs[name] = grads(lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3]),
                                           q, k, v, mask, grad)
                    else:
                        with sdpa_kernel(backend):
                            runs[name] = grads(lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3]),
                                               q, k, v, mask, grad)
                except RuntimeError as e:
                    runs[name] = str(e).splitlines()[0][:70]
            say(f"N = {n}, {str(dtype)[6:]}; relative errors of out, dq, dk, dv; masked rows 0-2 apart (dq rows)")
            for name, got in runs.items():
                if isinstance(got, str):
                    say(f"  {name:13s} refused: {got}")
                    continue
                for rname, ref in refs.items():
                    errs = " ".join(f"{rel(a.cpu(), b):9.2e}" for a, b in zip(got, ref))
                    rows = rel(got[1][..., :3, :].cpu(), ref[1][..., :3, :])
                    rest = rel(got[1][..., 3:, :].cpu(), ref[1][..., 3:, :])
                    say(f"  {name:13s} vs {rname:17s} {errs} | dq rows 0-2 {rows:9.2e}, rows 3+ {rest:9.2e}")
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
