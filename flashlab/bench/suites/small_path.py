"""What the small-path suites share (small-table, small-launches, tsp-step): routing-model sizes,
the switches they flip, how one attention call and one encoder training step are timed. The small
path is flashlab's one-tile kernels for sequences whose keys fit one tile (`flashlab.launch.small`).

Autotuning is off in these suites (FLASHLAB_AUTOTUNE=0: each kernel's default configuration), so
a run fits its budget and every number comes from a known configuration."""

from __future__ import annotations

import contextlib
import os

import torch

SIZES = {
    False: dict(correct_bh=(4, 4), correct_n=[1, 2, 17, 20, 50, 64, 100, 128], correct_d=[16, 64],
                table_bh=(512, 8), table_n=[20, 50, 100, 128, 1000], table_d=[16, 64],
                tsp_batch=512, tsp_nodes=[20, 50, 100], train_nodes=[20, 50], train_warmup=3, train_steps=10,
                choice_n=[100, 50, 20], choice_d=[16, 32, 64], tile_nodes=[100, 50, 20], tile_rounds=3,
                warmup_ms=10, rep_ms=40, cpu_runs=5),
    True: dict(correct_bh=(1, 2), correct_n=[1, 17, 20], correct_d=[16],
               table_bh=(2, 2), table_n=[20, 40], table_d=[16],
               tsp_batch=1, tsp_nodes=[4], train_nodes=[3], train_warmup=1, train_steps=1, compile_on_cpu=True,
               choice_n=[4], choice_d=[16], tile_nodes=[4], tile_rounds=2, warmup_ms=1, rep_ms=1, cpu_runs=1),
}


def sizes(quick: bool) -> dict:
    """The suites' sizes (a copy), with autotuning switched off for the process, and on a CPU
    PyTorch kept to at most four threads."""
    os.environ["FLASHLAB_AUTOTUNE"] = "0"
    if not torch.cuda.is_available():
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    return dict(SIZES[quick])


@contextlib.contextmanager
def switch(name: str, on: bool):
    """The environment switch ``name`` ("1" or "0") for the duration: flashlab reads its switches
    (FLASHLAB_SMALL_PATH, FLASHLAB_DIRECT_LAUNCH) on every call."""
    before = os.environ.get(name)
    os.environ[name] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def small_path(on: bool):
    """FLASHLAB_SMALL_PATH for the duration."""
    return switch("FLASHLAB_SMALL_PATH", on)


def refusal(exc: BaseException) -> str:
    """One line for an implementation that refused a shape (or failed on it)."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"


def eager_ms(fn, device, size) -> float:
    from flashlab.launch.timing import time_ms
    return time_ms(fn, device, size["warmup_ms"], size["rep_ms"], cpu_runs=size["cpu_runs"])


def graph_ms(fn, device, size):
    """Replay time of ``fn`` captured in a CUDA graph (`flashlab.launch.timing.time_graph_ms`); a string
    saying why not where it cannot be."""
    if device != "cuda":
        return "CUDA graphs need a CUDA GPU"
    from flashlab.launch.timing import time_graph_ms
    return time_graph_ms(fn, size["warmup_ms"], size["rep_ms"])


def steps(fn, q, k, v, grad):
    """The two things timed: a forward without autograd, and a forward+backward (the gradients
    handed over each time, as after optimizer.zero_grad())."""
    def forward():
        with torch.no_grad():
            fn(q, k, v)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(grad)
    return forward, forward_backward


def implementations():
    """name → (fn(q, k, v), small path on/off or None): flashlab as called, flashlab with the small
    path off (the general kernels), and SDPA's flash, memory-efficient and cuDNN backends forced."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashlab.api.attention import attention

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return run

    return {"flashlab": (attention, True), "flashlab_general": (attention, False),
            "sdpa_flash": (sdpa(SDPBackend.FLASH_ATTENTION), None),
            "sdpa_efficient": (sdpa(SDPBackend.EFFICIENT_ATTENTION), None),
            "sdpa_cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION), None)}


def autocast(device):
    return torch.autocast(device, dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def encoder_step(attention_fn, coords, device, mode=None):
    """One encoder training step (forward, squared-output loss, backward, Adam) of a fresh seeded
    model; with ``mode`` the encoder compiled as the trainer compiles it (forward and its
    backward; Adam stays eager)."""
    from flashlab.train.tsp import AttentionModel
    torch.manual_seed(0)
    model = AttentionModel(attention_fn=attention_fn).to(device)
    encode = torch.compile(model.encode, mode=mode) if mode else model.encode
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device):
            out = encode(coords)
        out.float().square().mean().backward()
        optimizer.step()
    return step


def captured_encoder_step_ms(attention_fn, coords, size) -> float:
    """One encoder training step (forward, loss, backward, Adam) captured whole in a CUDA graph,
    as PyTorch's CUDA-graph documentation captures a whole network: warm-up steps on a side
    stream, then the capture; the replay's time is the GPU's alone. The model and the data are
    the eager and compiled columns' (same seed, same instances)."""
    from flashlab.train.tsp import AttentionModel
    torch.manual_seed(0)
    model = AttentionModel(attention_fn=attention_fn).to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            out = model.encode(coords)
        out.float().square().mean().backward()
        optimizer.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    return eager_ms(graph.replay, "cuda", size)


def run_sections(ctx, sections, size) -> None:
    """Runs ``sections`` ((name, fn(device, size, ctx)) pairs) in order into ``ctx.record["sections"]``,
    saving after each; a section the budget leaves out, or one that fails, says so there."""
    ctx.record.update(autotune="off (FLASHLAB_AUTOTUNE=0)", sizes=size, sections={})
    for name, section in sections:
        if ctx.over():
            ctx.record["sections"][name] = {"skipped": ctx.skipped()}
            ctx.log(f"{name}: skipped (budget)")
            ctx.save()
            continue
        ctx.log(name)
        torch.manual_seed(0)
        try:
            ctx.record["sections"][name] = section(ctx.device, size, ctx)
        except Exception as exc:                     # recorded; the next section still runs
            import traceback
            ctx.record["sections"][name] = {"error": refusal(exc), "traceback": traceback.format_exc()[-2000:]}
            ctx.log(f"{name}: FAILED {refusal(exc)}")
        ctx.save()
    failed = [n for n, s in ctx.record["sections"].items() if "error" in s]
    if failed:
        ctx.record["error"] = f"sections failed: {', '.join(failed)}"
