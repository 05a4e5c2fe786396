"""The article's claim in a routing library's own training step (issue 19): RL4CO's Attention
Model (Kool et al.: embed 128, 8 heads, 3 encoder layers) trained by REINFORCE with a greedy
rollout baseline, its attention SDPA's default dispatch or flashlab's (``sdpa_fn``), steps/s.

    PYTHONPATH=. python -m measurements.rl4co_step OUT_DIR               # one H200, ~3 minutes
    PYTHONPATH=. python -m measurements.rl4co_step OUT_DIR --smoke       # CPU, tiny, < 1 minute

rl4co is not on the course's GPU machine: carry its wheels (`next_gpu_session.sh rl4co` says
which) and put them on PYTHONPATH. Variants, all from the same initial weights:

  sdpa              RL4CO as shipped (torch.nn.functional.scaled_dot_product_attention)
  flashlab          sdpa_fn=flashlab.attention: the encoder's self-attention and the decoder's
                    masked glimpse (one query row a step)
  flashlab_encoder  sdpa_fn_encoder=flashlab.attention, the decoder's glimpse left to SDPA

One step (RL4CO's AttentionModel.shared_step without Lightning): new instances from the
environment on the GPU, a greedy rollout of a frozen copy (the baseline; no gradients), a
sampled rollout with gradients, the REINFORCE loss ``((L - L_baseline) * log p).mean()``,
backward, Adam; bf16 autocast (Lightning's "bf16-mixed"). Eager: RL4CO's decoding loop (a
TensorDict environment stepped in Python) is not compiled. Timing: ``--warmup`` steps, then
``--repeats`` rounds in which each variant runs ``--steps`` steps back to back (variants
interleaved, so drift of the shared host hits all alike), synchronised; steps/s is the median
over rounds. Before timing, greedy tours of the sdpa and flashlab policies are compared
(identical tours in fp32, mean lengths; bf16 too) as a check that the two compute the same model.

Then one more step of each variant under torch.profiler: its wall time, the time the GPU's kernels
took (the rest the GPU waited for the host) and the attention kernels' share (``--no-profile`` skips it).

Writes OUT_DIR/rl4co_step.json (rewritten after each size: a crash keeps what was measured).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import time
from pathlib import Path

import torch

import flashlab

VARIANTS = ("sdpa", "flashlab", "flashlab_encoder")


def environment() -> dict:
    """`flashlab.bench.records.environment`, with the routing library's versions."""
    import rl4co
    import tensordict
    import torchrl

    from flashlab.bench.records import environment as flashlab_environment
    return {**flashlab_environment(), "rl4co": rl4co.__version__, "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__}


def make_policy(variant: str, embed_dim: int, heads: int, layers: int):
    from rl4co.models import AttentionModelPolicy
    fns = {"sdpa": {}, "flashlab": {"sdpa_fn": flashlab.attention},
           "flashlab_encoder": {"sdpa_fn_encoder": flashlab.attention}}[variant]
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
    alone flips near-ties (2026-12-05's H200 run, bf16 only: 64%, 19% and 3% identical at 20, 50 and
    100 cities, mean lengths within 0.1%). How many tours are identical, and the mean tour lengths."""
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


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


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
    sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        trainer.step()
        sync(device)
        wall_ms = 1000 * (time.perf_counter() - start)
    events = prof.key_averages()

    def own_ms(event):
        if device == "cuda":
            return getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0)) / 1000
        return event.self_cpu_time_total / 1000

    # on a GPU only the kernels (events without CPU time of their own); on a CPU every operator
    timed = [(e.key, own_ms(e)) for e in events if own_ms(e) > 0 and (device != "cuda" or e.self_cpu_time_total == 0)]
    busy = sum(ms for _, ms in timed)
    attention = sum(ms for name, ms in timed if ATTENTION_KERNELS.search(name))
    return {"wall_ms": wall_ms, "busy_ms": busy, "attention_ms": attention,
            "attention_share_of_wall": attention / wall_ms, "busy_share_of_wall": busy / wall_ms,
            "top": [[name[:120], ms] for name, ms in sorted(timed, key=lambda t: -t[1])[:10]]}


def measure(n: int, args, device: str) -> dict:
    from rl4co.envs import TSPEnv
    size = (args.embed_dim, args.heads, args.layers)
    torch.manual_seed(n)
    env = TSPEnv(generator_params={"num_loc": n}, device=device)
    weights = make_policy("sdpa", *size).state_dict()
    row = {"nodes": n, "batch": args.batch, "check": same_tours(weights, env, args.batch, device, size)}
    trainers = {v: Trainer(v, weights, env, args.batch, device, size) for v in VARIANTS}
    start = time.perf_counter()
    for trainer in trainers.values():
        for _ in range(args.warmup):
            trainer.step()
    sync(device)
    row["warmup_s"] = time.perf_counter() - start
    rounds = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant, trainer in trainers.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                trainer.step()
            sync(device)
            rounds[variant].append(args.steps / (time.perf_counter() - start))
    if args.profile:
        row["profile"] = {v: profile_step(trainer, device) for v, trainer in trainers.items()}
    row["steps_per_s"] = {v: statistics.median(r) for v, r in rounds.items()}
    row["steps_per_s_rounds"] = rounds
    row["speedup_vs_sdpa"] = {v: row["steps_per_s"][v] / row["steps_per_s"]["sdpa"] for v in VARIANTS}
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--smoke", action="store_true", help="CPU, 10 cities, batch 4, one step: the script runs")
    parser.add_argument("--nodes", type=int, nargs="+", default=[20, 50, 100])
    parser.add_argument("--batch", type=int, default=512, help="instances a step (Kool et al.: 512)")
    # 2026-12-05's run took 5 steps x 3 rounds: rounds of one variant spread 9.8-16.2 steps/s at 20 cities,
    # wider than any difference between the variants
    parser.add_argument("--steps", type=int, default=10, help="steps a variant runs in one round")
    parser.add_argument("--repeats", type=int, default=7, help="rounds, variants interleaved")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the profiled step per variant (wall time, GPU busy time, attention kernels' share)")
    parser.add_argument("--embed-dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=3)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.smoke:
        args.nodes, args.batch, args.steps, args.repeats, args.warmup = [10], 4, 1, 1, 1
        args.embed_dim, args.heads, args.layers = 32, 2, 1
    args.out_dir.mkdir(parents=True, exist_ok=True)
    record = {"environment": environment(), "how": __doc__, "settings": {k: str(v) for k, v in vars(args).items()},
              "rows": []}
    for n in args.nodes:
        try:
            row = measure(n, args, device)
        except Exception as exc:                       # recorded, the next size still runs
            row = {"nodes": n, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        record["rows"].append(row)
        (args.out_dir / "rl4co_step.json").write_text(json.dumps(record, indent=1))
        if "error" in row:
            print(f"N = {n}: {row['error']}", flush=True)
        else:
            rates = ", ".join(f"{v} {row['steps_per_s'][v]:.2f}" for v in VARIANTS)
            spread = ", ".join(f"{v} {min(r):.2f}-{max(r):.2f}" for v, r in row["steps_per_s_rounds"].items())
            print(f"N = {n}: steps/s {rates} (rounds: {spread}); flashlab ÷ sdpa "
                  f"{row['speedup_vs_sdpa']['flashlab']:.3f}, "
                  f"encoder only {row['speedup_vs_sdpa']['flashlab_encoder']:.3f}; "
                  f"identical greedy tours fp32 {row['check']['fp32']['identical_tours']:.1%}, "
                  f"bf16 {row['check']['bf16']['identical_tours']:.1%}", flush=True)
            for variant, prof in row.get("profile", {}).items():
                print(f"    profiled step, {variant}: {prof['wall_ms']:.1f} ms, kernels busy {prof['busy_ms']:.1f} ms, "
                      f"attention kernels {prof['attention_ms']:.2f} ms ({prof['attention_share_of_wall']:.1%} of the "
                      f"step)", flush=True)


if __name__ == "__main__":
    main()
