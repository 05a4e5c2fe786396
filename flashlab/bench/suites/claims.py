"""claims: GPU measurements for notebook 07b's circulating claims.

claim 2  B=2, N=2048, H=12, D=64, fp16: "standard attention peaks at about 5.2 GB against 2.1 GB with
         FlashAttention; forward 48 ms against 19 ms". Measured twice: attention alone (forward time,
         forward+backward peak), and a GPT-2-small-shaped model (12 layers, width 768, 12 heads;
         flashlab.train.model) in 16-mixed: forward time and a training step's peak memory, naive
         against flashlab attention.
claim 7  "PyTorch uses its fused flash kernel only when head_dim ≤ 128, in fp16/bf16, on Ampere or
         newer": for each head dim and dtype, which kernels SDPA's default dispatch launches (from the
         profiler), and whether forcing the flash backend is accepted."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashlab.bench.suite import Context, Suite

HEAD_DIMS = (64, 96, 128, 160, 192, 256)


def claim2():
    from flashlab.api.attention import attention
    from flashlab.bench.train_step import measure_step
    from flashlab.launch.timing import extra_memory, time_ms
    from flashlab.reference.naive import naive_attention
    from flashlab.train.model import CausalTransformer
    from flashlab.train.trainer import split_flat_config
    rows = []
    q, k, v = (torch.randn(2, 12, 2048, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    for name, fn in (("naive", naive_attention), ("flashlab", attention)):
        def fwd(fn=fn):
            with torch.no_grad():
                fn(q, k, v, is_causal=True)

        def fwd_bwd(fn=fn):
            torch.autograd.grad(fn(q, k, v, is_causal=True), (q, k, v), do)

        rows.append({"what": "attention alone", "attention": name, "fwd_ms": time_ms(fwd),
                     "fwd+bwd_extra_bytes": extra_memory(fwd_bwd, "cuda")})
    config = dict(seq_len=2048, num_pairs=256, vocab_size=50257, d_model=768, n_layers=12, n_heads=12,
                  batch_size=2, precision="16-mixed", device="cuda", progress=False, steps=10)
    for name in ("naive", "flashlab"):
        step = measure_step(*split_flat_config(dict(config, attention=name)), steps=3, warmup=2)
        model = CausalTransformer(50257, 2048, 768, 12, 12, name).cuda().eval()
        tokens = torch.randint(0, 50257, (2, 2048), device="cuda")

        def forward(model=model):
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
                model(tokens)

        rows.append({"what": "GPT-2-small shape, 16-mixed", "attention": name, "fwd_ms": time_ms(forward),
                     "train_step_ms": step["step_ms"], "train_peak_bytes": step["peak_bytes"]})
        del model
        torch.cuda.empty_cache()
    return rows


def _kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def claim7():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashlab.bench.analysis import sdpa_backend_from_kernels
    rows = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for head_dim in HEAD_DIMS:
            q, k, v = (torch.randn(2, 8, 1024, head_dim, device="cuda", dtype=dtype) for _ in range(3))
            kernels = _kernels(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            try:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                forced = "accepted"
            except RuntimeError as exc:
                forced = "refused: " + str(exc).splitlines()[0][:120]
            rows.append({"dtype": str(dtype), "head_dim": head_dim, "kernels": kernels[:6], "forced_flash": forced,
                         "default_backend": sdpa_backend_from_kernels(kernels)})
    return rows


def run(ctx: Context) -> None:
    ctx.record["capability"] = torch.cuda.get_device_capability()
    ctx.record["claim2"] = claim2()
    ctx.save()
    ctx.log(f"claim 2: {ctx.record['claim2']}")
    if ctx.over():
        ctx.record["claim7"] = ctx.skipped()
        return
    ctx.record["claim7"] = claim7()
    ctx.log(f"claim 7: {ctx.record['claim7']}")


SUITE = Suite(
    name="claims",
    summary="notebook 07b's claims 2 and 7: memory and time of a GPT-2-small shape; SDPA's dispatch",
    measures="claim 2: forward time and forward+backward extra memory of naive and flashlab attention, and a "
             "GPT-2-small-shaped model's forward time and training step (time, peak memory) in 16-mixed; claim 7: "
             "which kernels SDPA's default dispatch launches per head dimension and dtype, and whether its "
             "flash backend accepts them",
    shapes=f"claim 2: B = 2, N = 2048, H = 12, D = 64, fp16; claim 7: B = 2, H = 8, N = 1024, D = "
           f"{', '.join(map(str, HEAD_DIMS))}, fp16, bf16, fp32",
    budget_s=180, min_s=60, run=run, needs="gpu")
