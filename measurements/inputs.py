"""Random attention inputs for the GPU measurement scripts: one place for the seed and the layout."""
import torch


def attention_inputs(B: int, H: int, N: int, D: int, dtype=torch.bfloat16, device="cuda", seed: int = 0):
    """(q, k, v, grad): (B, H, N, D) normal tensors, q, k, v requiring grad, grad an upstream gradient."""
    torch.manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(B, H, N, D, device=device, dtype=dtype)
