"""dropin: flashlab.attention as a drop-in for SDPA, checked on the GPU (notebook 08 reads its TF32 part):

  dropin_contract_on_cuda  leading dims, Dv ≠ D, the float mask's gradient against SDPA's, CPU tensors on
                           the GPU machine, a mask beside is_causal refused as SDPA refuses it on CUDA
  fp32_exact_vs_tf32       fp32 exact (the default) against TF32 (allow_tf32): error against float64 and
                           forward time, D = 64 and 128
  compile_export_opcheck   a small model through flashlab attention: torch.compile (eager, aot_eager,
                           inductor), torch.export, torch.library.opcheck on CUDA tensors
  compiled_trainer_model   the trainer's model compiled with fullgraph=True (inductor) against eager:
                           step time and the same losses
  property_test            the property-based test with FLASHLAB_PROPERTY_EXAMPLES examples (1500 unless
                           set), autotuning off

Times are wall-clock per call over back-to-back calls (`flashlab.launch.timing.wall_ms`)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import traceback

import torch
import torch.nn.functional as F

from flashlab.api.attention import MultiHeadAttention, attention
from flashlab.bench.suite import Context, Suite
from flashlab.launch.timing import Stopwatch, wall_ms
from flashlab.train.model import CausalTransformer
from flashlab.train.tasks import AssociativeRecall

CTX: Context | None = None      # the run in progress (the property test's time limit)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def compiled_trainer_model():
    torch.manual_seed(0)
    seq_len, batch = 512, 32
    task = AssociativeRecall(seq_len=seq_len, num_pairs=32, vocab_size=128)
    x, y = task.batch(batch, seed=1, device="cuda")
    eager = CausalTransformer(vocab_size=128, max_len=seq_len, d_model=256, n_layers=4, n_heads=4,
                              attention="flashlab").cuda()
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True)
    out = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        params = eager.parameters() if name == "eager" else twin.parameters()
        opt = torch.optim.AdamW(params, lr=1e-3)
        losses = []

        def step(model=model, opt=opt, losses=losses):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss))

        first_10_s = wall_ms(step, 10, "cuda") * 10 / 1e3
        out[name] = {"losses_first_10_steps": losses[:10], "first_10_steps_s": first_10_s,
                     "step_ms": wall_ms(step, 20, "cuda", warmup=2)}
    le, lc = out["eager"]["losses_first_10_steps"], out["compiled"]["losses_first_10_steps"]
    out["max_abs_loss_difference_10_steps"] = max(abs(a - b) for a, b in zip(le, lc))
    out["speedup_compiled_over_eager"] = out["eager"]["step_ms"] / out["compiled"]["step_ms"]
    return out


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = MultiHeadAttention(64, 4, causal=True)

    def forward(self, x, mask):
        h = self.mha(x)
        q = h.view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
        return attention(q, q, q, attn_mask=mask).sum(-1)


def compile_export_opcheck():
    torch.manual_seed(0)
    model = _Small().cuda()
    x, mask = torch.randn(2, 100, 64, device="cuda"), torch.randn(2, 1, 1, 100, device="cuda")
    want = model(x, mask)
    want.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    out = {}
    for backend in ("eager", "aot_eager", "inductor"):
        model.zero_grad()
        torch._dynamo.reset()
        got = torch.compile(model, backend=backend, fullgraph=True)(x, mask)
        got.sum().backward()
        out[backend] = {"out_max_abs": float((got - want).abs().max()),
                        "grad_max_abs": max(float((p.grad - g).abs().max()) for p, g in zip(model.parameters(), grads))}
    exported = torch.export.export(model, (x, mask))
    out["export"] = {"custom_op_nodes": sum("flashlab" in str(n.target) for n in exported.graph.nodes),
                     "out_max_abs": float((exported.module()(x, mask) - want).abs().max())}
    q = torch.randn(1, 4, 70, 64, device="cuda", requires_grad=True)
    k, v = (torch.randn(1, 2, 90, 64, device="cuda", requires_grad=True) for _ in range(2))
    m = torch.randn(1, 1, 70, 90, device="cuda", requires_grad=True)
    for name, args in {"causal": (q, k, v, None, 0.0, None, True, 0.125, "ieee"),
                       "float_mask_dropout": (q, k, v, m, 0.2, torch.tensor(3), False, 0.125, "ieee")}.items():
        out[f"opcheck_{name}"] = torch.library.opcheck(torch.ops.flashlab.flash_attention_forward.default, args)
    return out


def fp32_exact_vs_tf32():
    out = {}
    for D in (64, 128):
        torch.manual_seed(0)
        q, k, v = (torch.randn(4, 8, 2048, D, device="cuda") for _ in range(3))
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        row = {}
        for setting in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = setting
            try:
                got = attention(q, k, v, is_causal=True)
                row["tf32" if setting else "exact"] = {
                    "rel_error_vs_fp64": _rel(got, ref),
                    "forward_ms": wall_ms(lambda: attention(q, k, v, is_causal=True), 20, "cuda", warmup=3)}
            except Exception as exc:
                row["tf32" if setting else "exact"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        torch.backends.cuda.matmul.allow_tf32 = False
        row["sdpa_exact_rel_error_vs_fp64"] = _rel(F.scaled_dot_product_attention(q, k, v, is_causal=True), ref)
        out[f"D={D}"] = row
    return out


def dropin_contract_on_cuda():
    torch.manual_seed(0)
    out = {}
    q, k, v = torch.randn(2, 3, 4, 50, 32, device="cuda"), torch.randn(2, 3, 4, 70, 32, device="cuda"), \
        torch.randn(2, 3, 4, 70, 48, device="cuda")
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    out["5d_dv48_rel_error"] = _rel(attention(q, k, v, is_causal=True, exact_fp32=True), want)
    q4, k4, v4 = (torch.randn(2, 4, 60, 64, device="cuda", requires_grad=True) for _ in range(3))
    mask = torch.randn(2, 1, 60, 60, device="cuda", requires_grad=True)
    g = torch.randn(2, 4, 60, 64, device="cuda")
    attention(q4, k4, v4, attn_mask=mask, exact_fp32=True).backward(g)
    got = mask.grad.clone()
    mask.grad = None
    F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask).backward(g)
    out["float_mask_grad_rel_error_vs_sdpa"] = _rel(got, mask.grad)
    # CPU tensors on the GPU machine: interpreted twins under this Triton (3.6 here); Triton 3.6's
    # interpreter with numpy ≥ 2.3 fails on `range(tensor)` in the kernels, whatever flashlab does
    qc = torch.randn(1, 2, 20, 16)
    try:
        out["cpu_tensor_on_gpu_machine_rel_error"] = _rel(attention(qc, qc, qc, is_causal=True),
                                                          F.scaled_dot_product_attention(qc, qc, qc, is_causal=True))
    except Exception as exc:
        import numpy
        out["cpu_tensor_on_gpu_machine_rel_error"] = f"numpy {numpy.__version__}: {type(exc).__name__}: {exc}"[:300]
    try:
        attention(q4, k4, v4, attn_mask=mask > 0, is_causal=True)
        out["mask_with_causal_on_cuda"] = "accepted (unexpected)"
    except ValueError as exc:
        out["mask_with_causal_on_cuda"] = f"refused: {exc}"[:300]
    return out


def property_test():
    # tuning off: every new shape bucket would otherwise compile every candidate configuration
    examples = os.environ.get("FLASHLAB_PROPERTY_EXAMPLES", "1500")
    watch = Stopwatch()
    env = {**os.environ, "FLASHLAB_PROPERTY_EXAMPLES": examples, "FLASHLAB_AUTOTUNE": "0"}
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/api/test_attention_properties.py", "-q", "-p",
                           "no:nbval", "-o", "addopts="], env=env, capture_output=True, text=True,
                          timeout=max(30.0, CTX.left_s()))
    return {"examples": int(examples), "returncode": done.returncode, "seconds": watch.seconds(),
            "tail": done.stdout[-1500:] + done.stderr[-500:]}


PARTS = {"dropin_contract_on_cuda": dropin_contract_on_cuda, "fp32_exact_vs_tf32": fp32_exact_vs_tf32,
         "compile_export_opcheck": compile_export_opcheck, "compiled_trainer_model": compiled_trainer_model,
         "property_test": property_test}


def run(ctx: Context) -> None:
    global CTX
    CTX = ctx
    for name, part in PARTS.items():
        if ctx.over():
            ctx.record[name] = {"skipped": ctx.skipped()}
            continue
        watch = Stopwatch()
        try:
            ctx.record[name] = part()
        except Exception as exc:          # record and go on: one failure must not hide the rest
            ctx.record[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "trace": traceback.format_exc()[-3000:]}
        ctx.log(f"{name} ({watch.seconds():.0f} s): {str(ctx.record[name])[:600]}")
        ctx.save()
    failed = [name for name in PARTS if isinstance(ctx.record.get(name), dict) and "error" in ctx.record[name]]
    if failed:
        ctx.record["error"] = f"parts failed: {', '.join(failed)}"


SUITE = Suite(
    name="dropin",
    summary="flashlab.attention as SDPA's drop-in on the GPU: contract, TF32, compile/export, trainer",
    measures="the drop-in contract on CUDA tensors; fp32 exact against TF32 (error against float64, forward "
             "time); torch.compile, torch.export and opcheck of a model through flashlab attention; the "
             "trainer's model compiled against eager (step time, losses); the property-based test",
    shapes="TF32: B = 4, H = 8, N = 2048, D = 64 and 128, causal, fp32; trainer: 4 layers, width 256, 512 tokens, "
           "batch 32, bf16 autocast",
    budget_s=540, min_s=60, run=run, needs="gpu")
