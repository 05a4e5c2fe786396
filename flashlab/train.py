"""The flashlab trainer: small enough to read in one sitting, complete enough to use.

One optimizer step:

    for each of `grad_accum` micro-batches:            (DDP: gradients sync on the last only)
        with autocast(precision):  loss = cross_entropy(model(x), y) / grad_accum
        scaler.scale(loss).backward()                   (16-mixed: loss scaling)
    scaler.unscale_(optimizer)                          (gradients back to true size …)
    norm = clip_grad_norm_(params, grad_clip)           (… so clipping sees the real norm)
    non-finite loss or norm → skip the step, count it; K in a row → stop with a message
    else scaler.step(optimizer); scaler.update(); scheduler.step()

Around it: precision modes (`flashlab.mixed_precision`), warm-up + cosine learning rate,
activation checkpointing per block, checkpoints that restore model, optimizer, scaler,
scheduler, step and RNG state (a resumed run reproduces an uninterrupted one), metrics to
CSV, a tqdm bar with loss, throughput and MFU, and data parallelism with
``torchrun --nproc_per_node N -m flashlab train …`` (DDP; gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import runtime
from .mixed_precision import get_precision
from .model import CausalTransformer
from .tasks import IGNORE_INDEX, AssociativeRecall, lookback
from .timing import attention_flops, peak_flops


@dataclass
class TrainConfig:
    """Every knob of a run. The defaults train a tiny model on CPU in seconds."""

    # task: multi-query associative recall (flashlab.tasks)
    seq_len: int = 64
    num_pairs: int = 8
    vocab_size: int = 64
    query_rate: float = 1.0                # < 1: sparse queries between filler, so recall reaches far back
                                           # (then micro-batches and ranks hold different numbers of answers,
                                           # yet each one's mean loss gets the same weight)
    # model
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.0
    attention: str = "sdpa"                # naive | sdpa | flashlab
    positions: str = "learned"             # learned | rotary (flashlab.model)
    rotary_fraction: float = 1.0           # share of each head's dimensions that rotary rotates
    checkpoint_blocks: bool = False        # activation checkpointing, per block
    # optimisation
    steps: int = 100
    batch_size: int = 32                   # sequences per optimizer step, all ranks and micro-batches together
    grad_accum: int = 1                    # micro-batches per optimizer step
    lr: float = 3e-3
    weight_decay: float = 0.1
    adam_beta2: float = 0.95               # AdamW's second-moment decay (0.999 is torch's default)
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1              # cosine decays to lr · min_lr_ratio
    grad_clip: float = 1.0                 # max global grad norm; 0 = no clipping
    precision: str = "32-true"             # 32-true | 16-mixed | bf16-mixed | 16-true | bf16-true
    tf32: bool = True                      # fp32 matmuls on TF32 tensor cores (GPU)
    max_bad_steps: int = 20                # stop after this many non-finite steps in a row
    time_limit_min: float = 0.0            # stop once training has taken this many minutes (0 = no limit);
                                           # counted across resumes, so two 8-minute runs make 16
    # bookkeeping
    seed: int = 0
    device: str = "auto"                   # auto | cpu | cuda
    out_dir: str | None = None             # metrics.csv and checkpoints go here
    checkpoint_every: int = 0              # steps; 0 = only at the end (if out_dir)
    resume: str | None = None              # checkpoint to resume from
    log_every: int = 10
    progress: bool = True


class TrainingDiverged(RuntimeError):
    """Raised after `max_bad_steps` consecutive steps with a non-finite loss or gradient."""


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _distributed() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) without it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if world > 1:
        return dist.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0"))
    return 0, 1, 0


class Trainer:
    """Builds task, model, optimizer, scheduler and scaler from a `TrainConfig`; `fit()`
    trains, `train_step()` does one optimizer step, `save()`/`load()` checkpoint."""

    def __init__(self, config: TrainConfig):
        self.config = c = config
        self.rank, self.world, local_rank = _distributed()
        if c.device == "auto":
            c.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(f"cuda:{local_rank}" if c.device == "cuda" else c.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.precision = get_precision(c.precision)
        if (c.attention == "flashlab" and self.device.type == "cpu" and runtime.triton_interpreted()
                and self.precision.compute_dtype == torch.bfloat16):
            raise ValueError("attention: flashlab's kernels run in Triton's interpreter on a CPU, which computes "
                             "bf16 wrongly. Use attention='sdpa' or a 32-true / 16-mixed precision on CPU.")
        if c.batch_size % (c.grad_accum * self.world):
            raise ValueError(f"batch_size: {c.batch_size} is not divisible by grad_accum × world size = "
                             f"{c.grad_accum} × {self.world}.")
        self.micro_batch = c.batch_size // (c.grad_accum * self.world)
        torch.backends.cuda.matmul.allow_tf32 = c.tf32
        torch.backends.cudnn.allow_tf32 = c.tf32

        torch.manual_seed(c.seed)                     # same initial weights on every rank
        self.task = self.build_task()
        self.model = self.build_model().to(self.device, self.precision.param_dtype)
        self.ddp = None
        if self.world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]      # no weight decay on norms and biases
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        # Adam divides by sqrt(v) + eps. In fp16 (16-true) eps = 1e-8 rounds to 0, and a weight
        # that has seen no gradient yet (v = 0) gets 0/0 = NaN: use the smallest safe eps there.
        eps = 1e-6 if self.precision.param_dtype == torch.float16 else 1e-8
        groups = [{"params": decay, "weight_decay": c.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=c.lr, betas=(0.9, c.adam_beta2), eps=eps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, c.warmup_steps, c.steps, c.min_lr_ratio))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.loss_scaling)
        self.step, self.skipped_steps, self.bad_in_a_row = 0, 0, 0
        self.train_seconds = 0.0                      # wall-clock inside fit(), all runs of a resumed job together
        self.history: list[dict] = []
        self.flops_per_step = self._flops_per_step()
        self.peak = peak_flops(torch.cuda.get_device_name(self.device), self.precision.compute_dtype) \
            if self.device.type == "cuda" else None
        if c.resume:
            self.load(c.resume)

    # ---------------------------------------------------------------- what a subclass changes
    metric_name = "accuracy"          # the per-step task metric in the history and the CSV

    def build_task(self):
        c = self.config
        return AssociativeRecall(c.seq_len, c.num_pairs, c.vocab_size, c.query_rate)

    def build_model(self) -> torch.nn.Module:
        c = self.config
        return CausalTransformer(c.vocab_size, c.seq_len, c.d_model, c.n_layers, c.n_heads, c.attention, c.dropout,
                                 c.checkpoint_blocks, c.positions, c.rotary_fraction)

    def on_step_end(self, metrics: dict) -> None:
        """Called by `fit` after every step (a subclass may evaluate, update a baseline …)."""

    def extra_state(self) -> dict:
        """More state for checkpoints (a subclass's baseline model, …)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    # ---------------------------------------------------------------- data and loss
    def global_batch(self, step: int):
        """All rows of step ``step`` (inputs, targets), a function of (seed, step) only."""
        return self.task.batch(self.config.batch_size, self.config.seed * 1_000_003 + step)

    def batch(self, step: int, micro: int):
        """This rank's rows of micro-batch ``micro`` of step ``step``: rows
        [(m·world + r)·micro_batch, …) of the global batch, so any world size or
        accumulation sees the same data."""
        first = (micro * self.world + self.rank) * self.micro_batch
        return tuple(None if t is None else t[first:first + self.micro_batch].to(self.device)
                     for t in self.global_batch(step))

    def compute_loss(self, inputs, targets) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean cross-entropy over answer positions, number of correct answers, number of
        answers): the step's metric is the sum of the second over the sum of the third."""
        logits = (self.ddp or self.model)(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        answered = targets != IGNORE_INDEX
        correct = (logits.argmax(-1) == targets)[answered].sum()
        return loss, correct, answered.sum()

    def _flops_per_step(self) -> float:
        """Model FLOPs of one optimizer step: 6 per parameter per token (forward 2, backward
        4) for the dense layers, plus attention counted as FlashAttention's papers do."""
        c = self.config
        tokens = c.batch_size * c.seq_len
        dense = 6 * self.model.num_parameters(non_embedding=True) * tokens
        head_dim = c.d_model // c.n_heads
        attn = c.n_layers * attention_flops(c.batch_size, c.n_heads, c.seq_len, head_dim, True, "fwd+bwd")
        return dense + attn

    # ---------------------------------------------------------------- one step
    def train_step(self) -> dict:
        c, model = self.config, self.model
        model.train()
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device)
        metric_sum = torch.zeros((), device=self.device)
        metric_count = torch.zeros((), device=self.device)
        for micro in range(c.grad_accum):
            inputs, targets = self.batch(self.step, micro)
            last = micro == c.grad_accum - 1
            sync = self.ddp.no_sync() if (self.ddp is not None and not last) else contextlib.nullcontext()
            with sync:
                with self.precision.autocast(self.device.type):
                    loss, total, count = self.compute_loss(inputs, targets)
                self.scaler.scale(loss / c.grad_accum).backward()   # each micro-batch: 1/accum of the mean
            loss_sum += loss.detach().float()
            metric_sum += total
            metric_count += count
        self.scaler.unscale_(self.optimizer)                        # true gradients before clipping
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip if c.grad_clip > 0 else math.inf)
        stats = torch.stack([loss_sum / c.grad_accum, metric_sum.float(), metric_count.float()])
        if self.world > 1:
            dist.all_reduce(stats)
            stats[0] /= self.world
        loss_value, metric_total, metric_n = stats.tolist()
        finite = math.isfinite(loss_value) and math.isfinite(grad_norm.item())
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        if finite:
            self.scaler.step(self.optimizer)
            self.bad_in_a_row = 0
        else:                                                        # NaN/inf guard: skip, count
            self.skipped_steps += 1
            self.bad_in_a_row += 1
        self.scaler.update()                                         # 16-mixed: shrink on inf, grow when stable
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        metrics = {"step": self.step, "loss": loss_value,
                   self.metric_name: metric_total / max(metric_n, 1),
                   "grad_norm": grad_norm.item(), "lr": lr, "loss_scale": scale, "skipped": int(not finite),
                   "step_ms": seconds * 1e3, "tokens_per_s": c.batch_size * c.seq_len / seconds,
                   "mfu": self.flops_per_step / seconds / self.peak if (self.peak and finite and self.flops_per_step)
                   else float("nan")}
        self.step += 1
        if self.bad_in_a_row >= c.max_bad_steps:
            raise TrainingDiverged(
                f"{self.bad_in_a_row} consecutive steps had a non-finite loss or gradient norm (last: step "
                f"{self.step - 1}, loss {loss_value}, grad norm {grad_norm.item()}). Lower lr, use bf16-mixed instead "
                f"of 16-true/16-mixed, or check the data; max_bad_steps={c.max_bad_steps} set this limit.")
        return metrics

    # ---------------------------------------------------------------- the loop
    def fit(self) -> list[dict]:
        from tqdm.auto import tqdm

        c = self.config
        out = Path(c.out_dir) if c.out_dir else None
        if out and self.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        bar = tqdm(total=c.steps, initial=self.step, desc=f"train {c.precision} {c.attention}",
                   disable=not c.progress or self.rank != 0)
        while self.step < c.steps:
            if c.time_limit_min and self.train_seconds >= 60 * c.time_limit_min:
                break
            started = time.perf_counter()
            metrics = self.train_step()
            self.on_step_end(metrics)
            self.train_seconds += time.perf_counter() - started
            metrics["train_seconds"] = self.train_seconds
            self.history.append(metrics)
            if out and self.rank == 0:
                self._append_csv(out / "metrics.csv", metrics)
            if metrics["step"] % c.log_every == 0 or self.step == c.steps:
                postfix = {"loss": f"{metrics['loss']:.3f}", self.metric_name: f"{metrics[self.metric_name]:.3g}",
                           "tok/s": f"{metrics['tokens_per_s']:.3g}"}
                if not math.isnan(metrics["mfu"]):
                    postfix["MFU"] = f"{metrics['mfu']:.1%}"
                bar.set_postfix(postfix)
            bar.update(1)
            if out and c.checkpoint_every and self.step % c.checkpoint_every == 0:
                self.save(out / f"checkpoint_{self.step}.pt")
        bar.close()
        if out:
            self.save(out / "checkpoint_last.pt")
        return self.history

    @staticmethod
    def _append_csv(path: Path, metrics: dict):
        # Columns are fixed by the file's header (a resumed run appends to the same file);
        # a metric the header lacks is an error rather than a silently shifted column.
        header = None
        if path.exists():
            with path.open(newline="") as f:
                header = next(csv.reader(f), None)
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header or list(metrics), restval="", extrasaction="raise")
            if not header:
                writer.writeheader()
            writer.writerow(metrics)

    # ---------------------------------------------------------------- checkpoints
    def save(self, path) -> None:
        """Everything a resumed run needs to continue exactly (rank 0 writes)."""
        if self.rank != 0:
            return
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                 "step": self.step, "skipped_steps": self.skipped_steps, "history": self.history,
                 "train_seconds": self.train_seconds,
                 "config": dataclasses.asdict(self.config), "rng_cpu": torch.get_rng_state(),
                 "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                 "extra": self.extra_state()}
        torch.save(state, path)

    def load(self, path) -> None:
        state = torch.load(path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.skipped_steps = state["step"], state["skipped_steps"]
        self.train_seconds = state.get("train_seconds", 0.0)
        self.history = list(state["history"])
        self.load_extra_state(state.get("extra", {}))
        torch.set_rng_state(state["rng_cpu"].cpu())
        if state["rng_cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["rng_cuda"]])

    def evaluate(self, batches: int = 4, seed: int = 10**9) -> float:
        """Recall accuracy on fresh batches (seeds far from the training seeds)."""
        (everything,) = self.evaluate_by_lookback((0, 2**62), batches, seed)     # one bucket: all answers
        return everything["accuracy"]

    @torch.no_grad()
    def evaluate_by_lookback(self, edges=(0, 64, 512, 4096, 32768, 2**31), batches: int = 4,
                             seed: int = 10**9, task: AssociativeRecall | None = None,
                             rows: int | None = None) -> list[dict]:
        """Recall accuracy on fresh batches, split by how far back the queried key was last
        mentioned (`flashlab.tasks.lookback`): one row per bucket [lo, hi) of ``edges`` with
        ``answers`` and ``accuracy`` (NaN where a bucket got no answers). ``task`` and
        ``rows`` (sequences per batch) default to the training ones; give others to test the
        model at another length or query rate."""
        self.model.eval()
        task, rows = task or self.task, rows or self.micro_batch
        edges = torch.tensor(edges)
        right = torch.zeros(len(edges) - 1, dtype=torch.float64)    # counts: exact in float64
        total = torch.zeros(len(edges) - 1, dtype=torch.float64)
        for i in range(batches):
            inputs, targets = task.batch(rows, seed + i)
            with self.precision.autocast(self.device.type):
                predicted = self.model(inputs.to(self.device)).argmax(-1).cpu()
            answered = targets != IGNORE_INDEX
            bucket = torch.bucketize(lookback(inputs)[answered], edges, right=True) - 1
            right += torch.bincount(bucket, (predicted == targets)[answered].double(), len(edges) - 1)
            total += torch.bincount(bucket, minlength=len(edges) - 1)
        return [{"lookback_from": int(lo), "lookback_to": int(hi), "answers": int(n),
                 "accuracy": (r / n).item() if n else math.nan}
                for lo, hi, r, n in zip(edges[:-1], edges[1:], right, total)]


def train(config: TrainConfig | None = None, **overrides) -> Trainer:
    """Train with ``config`` (or the defaults) updated by ``overrides``; returns the Trainer."""
    config = dataclasses.replace(config or TrainConfig(), **overrides)
    trainer = Trainer(config)
    trainer.fit()
    return trainer


def train_in_phases(config: TrainConfig, phases, out_dir):
    """A curriculum: for each ``(name, changes, minutes)`` of ``phases``, train ``config``
    updated by ``changes`` (sequence length, batch, query rate …) for ``minutes`` more,
    resuming the previous phase's checkpoint (weights, optimizer, step count, clock).
    Yields ``(name, trainer)`` after each phase, to evaluate before the next; metrics and
    checkpoints go to ``out_dir/name``."""
    minutes_so_far, previous = 0.0, None
    for name, changes, minutes in phases:
        minutes_so_far += minutes
        trainer = Trainer(dataclasses.replace(config, **changes, out_dir=f"{out_dir}/{name}",
                                              time_limit_min=minutes_so_far, resume=previous))
        trainer.fit()
        previous = f"{out_dir}/{name}/checkpoint_last.pt"
        yield name, trainer


def read_metrics(path) -> list[dict]:
    """The rows of a metrics CSV written by `Trainer.fit`, every value a float (NaN where empty)."""
    with open(path, newline="") as f:
        return [{k: float(v) if v != "" else math.nan for k, v in row.items()} for row in csv.DictReader(f)]


def plot_metrics(csv_paths: dict, y: str = "loss", ax=None):
    """Plot column ``y`` against step for each labelled metrics CSV."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for label, path in csv_paths.items():
        rows = read_metrics(path)
        ax.plot([int(r["step"]) for r in rows], [r[y] for r in rows], label=label)
    ax.set(xlabel="optimizer step", ylabel=y)
    ax.legend()
    return ax
