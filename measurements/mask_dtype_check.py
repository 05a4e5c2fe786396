"""GPU check: bf16 q, k, v beside a float32 additive mask (SDPA's rule), flashlab and each SDPA backend
against float64, fresh and after the same shapes ran under torch.autocast (mask cast to bf16 there)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashlab import attention


def err(a, b):
    return float((a.double() - b).norm() / b.norm())


torch.manual_seed(0)
for n in (9, 130):
    q, k, v = (torch.randn(1, 2, n, 16, device="cuda") for _ in range(3))
    m = torch.randn(1, 1, n, n, device="cuda")
    low = [t.bfloat16() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*(t.double() for t in low), attn_mask=m.double())
    print(n, "fresh flashlab fp32 mask", err(attention(*low, attn_mask=m), want))
    print(n, "flashlab bf16 mask", err(attention(*low, attn_mask=m.bfloat16()), want))
    print(n, "flashlab fp32 mask again", err(attention(*low, attn_mask=m), want))
    for b in (SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel(b):
                print(n, "sdpa", b.name, err(F.scaled_dot_product_attention(*low, attn_mask=m), want))
        except Exception as e:
            print(n, "sdpa", b.name, "refused:", str(e).splitlines()[0][:100])
    print(n, "sdpa default", err(F.scaled_dot_product_attention(*low, attn_mask=m), want))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        print(n, "autocast flashlab", err(attention(q, k, v, attn_mask=m), want),
              "sdpa", err(F.scaled_dot_product_attention(q, k, v, attn_mask=m), want))
    print(n, "after autocast flashlab fp32 mask", err(attention(*low, attn_mask=m), want),
          "sdpa", err(F.scaled_dot_product_attention(*low, attn_mask=m), want))
    lg = [t.clone().requires_grad_() for t in low]
    lg64 = [t.double().detach().requires_grad_() for t in low]
    out = attention(*lg, attn_mask=m)
    g = torch.randn_like(out)
    out.backward(g)
    F.scaled_dot_product_attention(*lg64, attn_mask=m.double()).backward(g.double())
    print(n, "grads flashlab fp32 mask", [round(err(a.grad, b.grad), 5) for a, b in zip(lg, lg64)])
