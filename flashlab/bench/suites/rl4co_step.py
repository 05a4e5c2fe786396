"""rl4co: the article's claim in a routing library's own training step: RL4CO's Attention Model
(Kool et al.: embed 128, 8 heads, 3 encoder layers) trained by REINFORCE with a greedy rollout
baseline, its attention SDPA's default dispatch or flashlab's (``sdpa_fn``), steps per second.
Variants, all from the same initial weights:

  sdpa              RL4CO as shipped (torch.nn.functional.scaled_dot_product_attention)
  flashlab          sdpa_fn=flashlab.attention: the encoder's self-attention and the decoder's
                    masked glimpse (one query row a step)
  flashlab_encoder  sdpa_fn_encoder=flashlab.attention, the decoder's glimpse left to SDPA

One step (RL4CO's AttentionModel.shared_step without Lightning): new instances from the environment,
a greedy rollout of a frozen copy (the baseline; no gradients), a sampled rollout with gradients,
the REINFORCE loss ``((L - L_baseline) * log p).mean()``, backward, Adam; bf16 autocast
(Lightning's "bf16-mixed"). Eager: RL4CO's decoding loop (a TensorDict environment stepped in
Python) is not compiled. Timing: warm-up steps, then rounds in which each variant runs its steps
back to back (`flashlab.launch.timing.wall_ms`; variants interleaved, so drift of the shared host
hits all alike); steps/s is the median over rounds. Before timing, greedy tours of the sdpa and
flashlab policies are compared (identical tours in fp32, mean lengths; bf16 too) as a check that the
two compute the same model. Then one more step of each variant under torch.profiler: its wall time,
the time the GPU's kernels took (the rest the GPU waited for the host) and the attention kernels' share.

rl4co is not installed on a bare GPU machine: download the wheels of WHEELS here
(``pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64
-d .whl ...``), carry .whl/, and there ``pip install --no-index --no-deps --target /tmp/site .whl/*.whl``
and run with ``PYTHONPATH=/tmp/site``."""

from __future__ import annotations

import copy
import re
import statistics
from types import SimpleNamespace

import torch

from flashlab.bench.suite import Context, Suite
from flashlab.launch.timing import wall_ms

WHEELS = ("rl4co==0.7.0", "torchrl==0.12.0", "tensordict==0.12.4", "hydra-core==1.3.8", "omegaconf==2.3.0",
          "colorlog==6.12.0", "robust-downloader==0.0.2", "pyvers==0.2.3", "importlib_metadata==10.2.0",
          "orjson==3.13.0", "antlr4-python3-runtime==4.9.3")
SETTINGS = dict(nodes=[20, 50, 100], batch=512, steps=10, repeats=7, warmup=3, profile=True, embed_dim=128, heads=8,
                layers=3)
QUICK = dict(SETTINGS, nodes=[10], batch=4, steps=1, repeats=1, warmup=1, embed_dim=32, heads=2, layers=1)

VARIANTS = ("sdpa", "flashlab", "flashlab_encoder")


def versions() -> dict:
    """The routing library's versions, for the record's environment."""
    import rl4co
    import tensordict
    import torchrl
    return {"rl4co": rl4co.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__}


def make_policy(variant: str, embed_dim: int, heads: int, layers: int):
    from rl4co.models import AttentionModelPolicy

    from flashlab.api.attention import attention
    fns = {"sdpa": {}, "flashlab": {"sdpa_fn": attention},
           "flashlab_encoder": {"sdpa_fn_encoder": attention}}[variant]
    return AttentionModelPolicy(env_name="tsp", embed_dim=embed_dim, num_heads=heads, num_encoder_layers=layers,
                                **fns)


class Trainer:
    """One variant's policy, its frozen baseline copy and Adam: `step()` is one REINFORCE step."""

    def __init__(self, variant, weights, env, batch, device, size):
        self.policy = make_policy(variant, *size).to(device)
        self.policy.load_state_dict(weights)
        self.baseline = copy.deepcopy(self.policy).eval()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-4)
        self.env, self.batch, self.device = env, batch, device

    def step(self):
        td = self.env.reset(batch_size=[self.batch]).to(self.device)
        with torch.autocast(self.device, dtype=torch.bfloat16):
            with torch.no_grad():
                base = self.baseline(td.clone(), self.env, decode_type="greedy")["reward"]
            out = self.policy(td, self.env, phase="train", decode_type="sampling")
        advantage = out["reward"] - base                       # reward = −tour length
        loss = -(advantage.detach() * out["log_likelihood"].float()).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def same_tours(weights, env, batch, device, size) -> dict:
    """Greedy tours of the sdpa and flashlab policies from the same weights and instances. In fp32
    they should agree but for near-ties, which an untrained policy's near-uniform choices make
    possible (on the CPU at the smoke size they agree). Under bf16 autocast, as they train, rounding
    alone flips near-ties (results/<gpu>/rl4co.json holds how many). How many tours are identical, and
    the mean tour lengths."""
    td = env.reset(batch_size=[batch]).to(device)
    check = {}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        tours = {}
        for variant in ("sdpa", "flashlab"):
            policy = make_policy(variant, *size).to(device)
            policy.load_state_dict(weights)
            with torch.no_grad(), torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = policy(td.clone(), env, decode_type="greedy", return_actions=True)
            tours[variant] = (out["actions"], -out["reward"].float().mean().item())
        check[label] = {"identical_tours": float((tours["sdpa"][0] == tours["flashlab"][0]).all(-1).float().mean()),
                        "mean_length_sdpa": tours["sdpa"][1], "mean_length_flashlab": tours["flashlab"][1]}
    return check


# kernel names of attention: flashlab's (small, general, Hopper) and SDPA's backends (flash, memory-efficient
# "fmha", cuDNN) as the profiler reports them
ATTENTION_KERNELS = re.compile(r"small_(forward|backward)_kernel|flash|fmha|sdpa|attention|hopper_(forward|dkdv|dq)"
                               r"|cudnn", re.IGNORECASE)


def profile_step(trainer, device: str) -> dict:
    """One step under torch.profiler: its wall time, the GPU's busy time (the kernels' own time
    summed; less than the wall time by what the GPU waited for the host) and the attention kernels'
    share of it, with the step's ten longest kernels. On a CPU, operators' self CPU time instead."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        wall = wall_ms(trainer.step, 1, device)
    events = prof.key_averages()

    def own_ms(event):
        if device == "cuda":
            return getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0)) / 1000
        return event.self_cpu_time_total / 1000

    # on a GPU only the kernels (events without CPU time of their own); on a CPU every operator
    timed = [(e.key, own_ms(e)) for e in events if own_ms(e) > 0 and (device != "cuda" or e.self_cpu_time_total == 0)]
    busy = sum(ms for _, ms in timed)
    attention = sum(ms for name, ms in timed if ATTENTION_KERNELS.search(name))
    return {"wall_ms": wall, "busy_ms": busy, "attention_ms": attention,
            "attention_share_of_wall": attention / wall, "busy_share_of_wall": busy / wall,
            "top": [[name[:120], ms] for name, ms in sorted(timed, key=lambda t: -t[1])[:10]]}


def measure(n: int, args, device: str) -> dict:
    from rl4co.envs import TSPEnv
    size = (args.embed_dim, args.heads, args.layers)
    torch.manual_seed(n)
    env = TSPEnv(generator_params={"num_loc": n}, device=device)
    weights = make_policy("sdpa", *size).state_dict()
    row = {"nodes": n, "batch": args.batch, "check": same_tours(weights, env, args.batch, device, size)}
    trainers = {v: Trainer(v, weights, env, args.batch, device, size) for v in VARIANTS}
    row["warmup_s"] = sum(wall_ms(trainer.step, args.warmup, device) * args.warmup / 1e3
                          for trainer in trainers.values())
    rounds = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant, trainer in trainers.items():
            rounds[variant].append(1e3 / wall_ms(trainer.step, args.steps, device))
    if args.profile:
        row["profile"] = {v: profile_step(trainer, device) for v, trainer in trainers.items()}
    row["steps_per_s"] = {v: statistics.median(r) for v, r in rounds.items()}
    row["steps_per_s_rounds"] = rounds
    row["speedup_vs_sdpa"] = {v: row["steps_per_s"][v] / row["steps_per_s"]["sdpa"] for v in VARIANTS}
    return row


def run(ctx: Context) -> None:
    args = SimpleNamespace(**(QUICK if ctx.quick else SETTINGS))
    ctx.record["environment"].update(versions())
    ctx.record.update(how=__doc__, settings={k: str(v) for k, v in vars(args).items()}, rows=[])
    for n in args.nodes:
        if ctx.over():
            ctx.record["rows"].append({"nodes": n, "skipped": ctx.skipped()})
            continue
        try:
            row = measure(n, args, ctx.device)
        except Exception as exc:                       # recorded, the next size still runs
            row = {"nodes": n, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        ctx.record["rows"].append(row)
        ctx.save()
        if "error" in row:
            ctx.log(f"N = {n}: {row['error']}")
            continue
        rates = ", ".join(f"{v} {row['steps_per_s'][v]:.2f}" for v in VARIANTS)
        spread = ", ".join(f"{v} {min(r):.2f}-{max(r):.2f}" for v, r in row["steps_per_s_rounds"].items())
        ctx.log(f"N = {n}: steps/s {rates} (rounds: {spread}); flashlab ÷ sdpa "
                f"{row['speedup_vs_sdpa']['flashlab']:.3f}, "
                f"encoder only {row['speedup_vs_sdpa']['flashlab_encoder']:.3f}; "
                f"identical greedy tours fp32 {row['check']['fp32']['identical_tours']:.1%}, "
                f"bf16 {row['check']['bf16']['identical_tours']:.1%}")
        for variant, prof in row.get("profile", {}).items():
            ctx.log(f"profiled step, {variant}: {prof['wall_ms']:.1f} ms, kernels busy {prof['busy_ms']:.1f} ms, "
                    f"attention kernels {prof['attention_ms']:.2f} ms ({prof['attention_share_of_wall']:.1%} of the "
                    "step)")
    if any("error" in row for row in ctx.record["rows"]):
        ctx.record["error"] = "a size failed (its row says why)"


SUITE = Suite(
    name="rl4co",
    summary="RL4CO's own REINFORCE step with SDPA vs flashlab attention",
    measures="steps per second of RL4CO's Attention Model REINFORCE step with SDPA, flashlab everywhere and "
             "flashlab in the encoder only (median of interleaved rounds); identical greedy tours in fp32 and "
             "bf16; one profiled step per variant (wall, GPU busy, attention kernels' share)",
    shapes="20, 50 and 100 cities, batch 512, embed 128, 8 heads, 3 layers, bf16 autocast; 3 warm-up steps, 7 "
           "rounds of 10 steps. --quick: 10 cities, batch 4, embed 32, 1 layer, one step",
    budget_s=420, min_s=60, run=run, needs="gpu, or quick", requires=("rl4co",))
