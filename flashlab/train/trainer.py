"""The flashlab trainer: small enough to read in one sitting, complete enough to use.

One optimizer step:

    for each of `grad_accum` micro-batches:            (DDP: gradients sync on the last only)
        with autocast(precision):  loss = cross_entropy(model(x), y) / grad_accum
        scaler.scale(loss).backward()                   (16-mixed: loss scaling)
    scaler.unscale_(optimizer)                          (gradients back to true size …)
    norm = clip_grad_norm_(params, grad_clip)           (… so clipping sees the real norm)
    non-finite loss or norm → skip the step, count it; max_bad_steps in a row → stop (0: never)
    else scaler.step(optimizer); scaler.update(); scheduler.step()

Configuration by composition: a `RunConfig` (optimisation and bookkeeping, the same for
every task) and a task config owned by the task (`RecallConfig` here, `TSPConfig` in
`flashlab.train.tsp_train`); every field declares its help, range and whether it may change on
resume (`flashlab.train.config`).

Around it: precision modes (`flashlab.train.mixed_precision`), warm-up + cosine learning rate,
activation checkpointing per block, checkpoints (`flashlab.train.checkpoint`: tensors and plain
data, written atomically, verified on load) that restore model, optimizer, scaler,
scheduler, step and RNG state (a resumed run reproduces an uninterrupted one, and checks
that it resumes the same model and task), metrics to CSV (each step once, across
resumes), a tqdm bar with loss, throughput and MFU, and data parallelism with
``torchrun --nproc_per_node N -m flashlab train …`` (DDP; gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gzip
import io
import math
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from flashlab.launch.timing import attention_flops, peak_flops

from . import checkpoint, memory, run_dir
from .config import ConfigError, FieldsChecked, apply_changes, check_fields, option, resume_mismatches, stored_problem
from .mixed_precision import PRECISIONS, get_precision
from .model import CausalTransformer
from .tasks import IGNORE_INDEX, AssociativeRecall, lookback


def default_attention(device: str) -> str:
    """flashlab's kernels where they run compiled (CUDA); SDPA on a CPU, where the kernels
    would run in Triton's interpreter (right, but thousands of times slower)."""
    return "flashlab" if device == "cuda" else "sdpa"


ATTENTION_HELP = ("auto: flashlab on a GPU (compiled Triton kernels), sdpa on a CPU (the kernels would run in "
                  "Triton's slow interpreter); may change on resume")


@dataclass
class RunConfig(FieldsChecked):
    """How to train, whatever the task: optimisation and bookkeeping. The defaults suit the
    associative-recall transformer; each task may bring its own (`flashlab.train.tsp_train.KOOL_RUN`)."""

    steps: int = option(100, "train until this optimizer step (a resumed run counts on from its checkpoint)",
                        low=1)
    batch_size: int = option(32, "examples per optimizer step, all ranks and micro-batches together", low=1)
    grad_accum: int = option(1, "micro-batches per optimizer step; must divide batch_size / world size", low=1)
    lr: float = option(3e-3, "peak learning rate (AdamW); a new value takes effect on resume", low=0, low_open=True)
    weight_decay: float = option(0.1, "AdamW weight decay of matrices (none on norms and biases)", low=0)
    adam_beta2: float = option(0.95, "AdamW's second-moment decay (torch's default: 0.999)", low=0, high=1,
                               high_open=True)
    warmup_steps: int = option(10, "steps of linear learning-rate warm-up", low=0)
    min_lr_ratio: float = option(0.1, "the cosine decays to lr·min_lr_ratio at the last step (1: constant lr)",
                                 low=0, high=1)
    grad_clip: float = option(1.0, "largest global gradient norm; 0 = no clipping", low=0)
    precision: str = option("32-true", "precision mode (flashlab.train.mixed_precision)",
                            choices=tuple(PRECISIONS), on_resume="fixed")
    tf32: bool = option(True, "fp32 matmuls on TF32 tensor cores (GPU only)")
    compile: str = option("off", "off: eager steps; default: torch.compile the model for training steps "
                                 "(inductor's fused kernels); reduce-overhead: the same, then each step replays "
                                 "as a CUDA graph (GPU only), for models paced by launches rather than "
                                 "arithmetic, many small kernels per step. The first steps pay the compilation "
                                 "(seconds to minutes)",
                          choices=("off", "default", "reduce-overhead"))
    max_bad_steps: int = option(20, "stop once this many optimizer steps in a row were skipped for a non-finite "
                                    "loss or gradient norm; 0 = never stop (skip and count only)", low=0)
    time_limit_min: float = option(0.0, "stop once training has taken this many minutes, counted across resumes; "
                                        "0 = no limit", low=0)
    # below 2^31: step s's batch comes from seed·1,000,003 + s, which must stay a 64-bit generator seed, and
    # the TSP trainer's evaluation set from −(seed + 1) mod 2^31, distinct for every such seed
    seed: int = option(0, "seed of the initial weights and of every batch", low=0, high=2**31 - 1,
                       on_resume="fixed")
    device: str = option("auto", "auto: cuda when a GPU is visible, else cpu", choices=("auto", "cpu", "cuda"))
    out_dir: str | None = option(None, "directory for metrics.csv and checkpoints (created if missing)")
    checkpoint_every: int = option(0, "save checkpoint_<step>.pt and checkpoint_last.pt every this many steps; "
                                      "0 = checkpoint_last.pt at the end only", low=0)
    keep_checkpoints: int = option(0, "keep only the newest this many checkpoint_<step>.pt files (checkpoint_last.pt "
                                      "always stays); 0 = keep every one", low=0)
    resume: str | None = option(None, "continue from this training-state checkpoint (e.g. OUT_DIR/checkpoint_last.pt), "
                                      "or auto: the newest complete checkpoint in out_dir (a new run if it holds "
                                      "none); the command line takes its fixed settings unless given")
    log_every: int = option(10, "update the progress bar's numbers every this many steps", low=1)
    progress: bool = option(True, "show a progress bar")

    def check(self) -> None:
        check_fields(self)
        if self.out_dir == "":
            raise ConfigError("out_dir", "'' is an empty path; give a directory (created if missing), or none at all "
                                         "to save nothing.")
        if self.resume == "":
            raise ConfigError("resume", "'' is an empty path; give a checkpoint's path, or auto to resume the newest "
                                        "one in out_dir.")
        if self.resume == "auto" and not self.out_dir:
            raise ConfigError("resume", "auto resumes the newest checkpoint in out_dir, and no out_dir is given; add "
                                        "one.")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", "cuda was asked for but no CUDA GPU is visible to torch; use cpu or auto.")
        # on a CPU, reduce-overhead compiles as default does and then records no CUDA graph: the
        # minutes of compilation buy nothing the user asked for, so it is refused, not run
        why = no_cuda_graphs(self.device)
        if self.compile == "reduce-overhead" and why:
            raise ConfigError("compile", f"reduce-overhead is GPU only, as it replays CUDA graphs, and {why}; on a "
                                         f"CPU give off, or default to compile without CUDA graphs.")


def no_cuda_graphs(device: str) -> str | None:
    """Why a run with ``device`` (auto, cpu or cuda) can replay no CUDA graph, or None if it can."""
    if device == "cpu":
        return "the device is cpu"
    if not torch.cuda.is_available():
        return "no GPU was found, so device auto runs on the CPU"
    return None


@dataclass
class RecallConfig(FieldsChecked):
    """The associative-recall task (flashlab.train.tasks) and the causal transformer that learns it."""

    seq_len: int = option(64, "tokens per sequence; may change on resume (a curriculum) when positions=rotary",
                          low=2)
    num_pairs: int = option(8, "key-value pairs at the start of each sequence", low=1, on_resume="fixed")
    vocab_size: int = option(64, "tokens in the vocabulary: keys from the lower half, values from the upper",
                             low=2, on_resume="fixed")
    query_rate: float = option(1.0, "probability that a query slot asks; < 1 puts filler between queries so recall "
                                    "reaches far back (may change on resume)", low=0, low_open=True, high=1)
    d_model: int = option(64, "model width", low=1, on_resume="fixed")
    n_layers: int = option(2, "transformer blocks", low=1, on_resume="fixed")
    n_heads: int = option(4, "attention heads; must divide d_model", low=1, on_resume="fixed")
    dropout: float = option(0.0, "dropout probability in attention", low=0, high=1, high_open=True)
    attention: str = option("auto", ATTENTION_HELP, choices=("auto", "flashlab", "sdpa", "naive"))
    positions: str = option("learned", "learned: a position table of seq_len rows; rotary: RoPE, no table",
                            choices=("learned", "rotary"), on_resume="fixed")
    rotary_fraction: float = option(1.0, "share of each head's dimensions that rotary rotates", low=0, low_open=True,
                                    high=1, on_resume="fixed")
    checkpoint_blocks: bool = option(False, "activation checkpointing: recompute each block in the backward")

    def check(self) -> None:
        check_fields(self)
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", f"{self.n_heads} does not divide d_model={self.d_model}; pick a divisor.")
        try:                                                             # the task's own checks
            AssociativeRecall(self.seq_len, self.num_pairs, self.vocab_size, self.query_rate)
        except ValueError as exc:
            name, _, reason = str(exc).partition(": ")
            raise ConfigError(name, reason) from None

    def resume_mismatches(self, stored: dict) -> list[str]:
        lines = resume_mismatches(self, stored)
        if self.positions == "learned" and stored.get("seq_len") not in (None, self.seq_len):
            lines.append(f"seq_len is {self.seq_len} but the checkpoint's learned position table has "
                         f"{stored['seq_len']} rows (only positions=rotary runs may change seq_len)")
        return lines


class TrainingDiverged(RuntimeError):
    """Raised after `max_bad_steps` consecutive steps with a non-finite loss or gradient."""


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _distributed(device: str) -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) without it. The
    process group's backend follows the run's device, not the machine: NCCL reduces CUDA tensors
    only, so a CPU run on a machine with GPUs takes gloo (with NCCL it failed as DDP checked the
    parameters: "No backend type associated with device type cpu")."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if world > 1:
        return dist.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0"))
    return 0, 1, 0


class TrainingInterrupted(KeyboardInterrupt):
    """Raised by `Trainer.fit` once a SIGINT (Ctrl-C) or SIGTERM has stopped it between two steps,
    after it saved the state of the last finished step (with an out_dir): the run resumes from
    there exactly (``--resume OUT_DIR/checkpoint_last.pt``)."""

    def __init__(self, signal_name: str, step: int, saved_to: Path | None):
        self.signal_name, self.step, self.saved_to = signal_name, step, saved_to
        where = (f"saved {saved_to}; continue with --resume {saved_to}" if saved_to
                 else "nothing saved (no out_dir)")
        super().__init__(f"stopped by {signal_name} after step {step}: {where}")


class StoppedAtOnce(KeyboardInterrupt):
    """Raised inside `Trainer.fit` by a second SIGINT or SIGTERM while the first one waited for the
    step to end: the step is cut where it was and nothing is saved (a later ``--resume`` starts from
    the last checkpoint written before)."""

    def __init__(self, signal_name: str, last_saved: Path | None = None):
        self.signal_name, self.last_saved = signal_name, last_saved
        where = (f"nothing saved since {last_saved}; continue with --resume {last_saved}" if last_saved
                 else "nothing saved (this run had written no checkpoint yet)")
        super().__init__(f"stopped at once by a second {signal_name}, mid-step: {where}")


@contextlib.contextmanager
def _stop_between_steps(enabled: bool, last_saved=lambda: None):
    """While `fit` runs: the first SIGINT or SIGTERM asks the loop to stop after the step it is
    in (a step cut in half leaves the model and optimizer half-updated, nothing to save); a second
    one, of either kind, interrupts at once (`StoppedAtOnce`). Yields the list the handler appends
    the signal to; ``last_saved()`` names the checkpoint a later ``--resume`` would start from. Only in
    a process's main thread: Python handles signals there alone. Ranks of a distributed run each
    handle their own, and stop where their step's all-reduce says one of them was asked
    (`Trainer.train_step`): at different steps they would wait for each other forever."""
    requested: list[int] = []
    if not enabled:
        yield requested
        return

    def handler(signum, frame):
        if requested:               # asked twice: whoever sent it does not want to wait for the step
            raise StoppedAtOnce(signal.Signals(signum).name, last_saved())
        # said at once: the step (or an epoch's baseline rollout) may take a while; by one rank of a torchrun
        if os.environ.get("RANK", "0") == "0":
            print(f"{signal.Signals(signum).name}: stopping after the current step, then saving a checkpoint "
                  "(a second Ctrl-C or SIGTERM stops at once without saving)", file=sys.stderr, flush=True)
        requested.append(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


class Trainer:
    """Builds task, model, optimizer, scheduler and scaler from a task config and a
    `RunConfig`; `fit()` trains, `train_step()` does one optimizer step, `save()`/`load()`
    checkpoint (`flashlab.train.checkpoint`: tensors and plain data, atomic, verified).

    This class trains the associative-recall transformer (`RecallConfig`); a task changes
    the hooks below (`flashlab.train.tsp_train.TSPTrainer`). Batches reach the model as the task
    makes them: in 16-true and bf16-true the weights are 16-bit, so a model that takes
    floating-point inputs casts them to its weights' dtype itself (as
    `flashlab.train.tsp.AttentionModel` does with the coordinates); the mixed modes' autocast needs
    no cast."""

    task_config_class = RecallConfig
    checkpoint_kind = "lm-training-state"
    command = "train"                 # the command that resumes its checkpoints: python -m flashlab <command>
    metric_name = "accuracy"          # the per-step task metric in the history and the CSV
    work_unit = "tokens"              # what the throughput column counts: <work_unit>_per_s
    # the settings that size the model and the batch: a refused size names one of them (`_check_memory`)
    size_fields = ("seq_len", "d_model", "n_layers", "vocab_size", "n_heads", "batch_size")
    clock = staticmethod(time.perf_counter)   # the training clock (time limit); tests give a fake one

    def __init__(self, task=None, run: RunConfig | None = None):
        task = self.task_config_class() if task is None else task
        run = RunConfig() if run is None else run
        if not isinstance(task, self.task_config_class):
            raise TypeError(f"task: a {type(task).__name__}; {type(self).__name__} takes a "
                            f"{self.task_config_class.__name__} (and a RunConfig as run).")
        if not isinstance(run, RunConfig):
            raise TypeError(f"run: a {type(run).__name__}; give a flashlab.train.trainer.RunConfig.")
        task.check()
        run.check()
        device = run.device if run.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        run = dataclasses.replace(run, device=device)
        if task.attention == "auto":
            task = dataclasses.replace(task, attention=default_attention(device))
        self.task_config, self.run = task, run
        self.rank, self.world, local_rank = _distributed(device)
        self.device = torch.device(f"cuda:{local_rank}" if device == "cuda" else device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.precision = get_precision(run.precision)
        if run.batch_size % (run.grad_accum * self.world):
            raise ConfigError("batch_size", f"{run.batch_size} is not divisible by grad_accum × world size = "
                                            f"{run.grad_accum} × {self.world}.")
        if run.out_dir and self.rank == 0:
            _check_writable_dir(run.out_dir)
        self.micro_batch = run.batch_size // (run.grad_accum * self.world)
        self._check_memory(training=False)            # the model's weights, before they are allocated
        torch.backends.cuda.matmul.allow_tf32 = run.tf32
        torch.backends.cudnn.allow_tf32 = run.tf32

        torch.manual_seed(run.seed)                   # same initial weights on every rank
        self.task = self.build_task()
        self.model = self.build_model().to(self.device, self.precision.param_dtype)
        self.ddp = None
        if self.world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        # what a training step calls: the model (or its DDP wrapper), compiled if asked; checkpoints
        # and evaluation keep using self.model, whose parameters the compiled module shares
        self.forward_model = self.ddp or self.model
        if run.compile != "off":
            mode = None if run.compile == "default" else run.compile
            self.forward_model = torch.compile(self.forward_model, mode=mode)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]      # no weight decay on norms and biases
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        # Adam divides by sqrt(v) + eps. In fp16 (16-true) eps = 1e-8 rounds to 0, and a weight
        # that has seen no gradient yet (v = 0) gets 0/0 = NaN: use the smallest safe eps there.
        eps = 1e-6 if self.precision.param_dtype == torch.float16 else 1e-8
        groups = [{"params": decay, "weight_decay": run.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=run.lr, betas=(0.9, run.adam_beta2), eps=eps)
        # the lambda reads self.run at every step, so steps, warm-up and decay may change on resume
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, self.run.warmup_steps, self.run.steps, self.run.min_lr_ratio))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.loss_scaling)
        self.step, self.skipped_steps, self.bad_in_a_row = 0, 0, 0
        self.train_seconds = 0.0                      # training clock inside fit(), all runs of a resumed job together
        self.history: list[dict] = []
        self.flops_per_step = self._flops_per_step()
        self.peak = peak_flops(torch.cuda.get_device_name(self.device), self.precision.compute_dtype) \
            if self.device.type == "cuda" else None
        self._stop_requests: list[int] = []   # signals this process was sent during fit (`_stop_between_steps`)
        self._ranks_agree_to_stop = False     # distributed: every rank stops after this step (`train_step`)
        self._out_dir_lock: Path | None = None   # the out_dir this trainer holds (`hold_out_dir`)
        self._last_good: tuple[Path, int] | None = None   # (checkpoint, step) a failed write's message names
        if run.resume == "auto":                  # the newest complete checkpoint in out_dir, else a new run
            found = run_dir.newest_checkpoint(run.out_dir, kind=self.checkpoint_kind)
            self.run = run = dataclasses.replace(run, resume=str(found[0]) if found else None)
        self._out_dir_is_ours = bool(run.resume)   # resuming continues a run; a fresh one may not write over one
        if run.resume:
            self.load(run.resume)
            self._last_good = (Path(run.resume), self.step)

    # ---------------------------------------------------------------- the run's directory and files
    def hold_out_dir(self) -> None:
        """Take run.out_dir for this run until `release_out_dir` (or the process ends): rank 0 takes
        its lock (`flashlab.train.run_dir.hold`), and under torchrun every rank learns the outcome,
        so that all of them refuse together or run together. Raises `ConfigError` on out_dir while
        another run holds it."""
        if self._out_dir_lock is not None or not self.run.out_dir:
            return
        refusal = None
        if self.rank == 0:
            try:
                run_dir.hold(self.run.out_dir)
            except ConfigError as exc:
                refusal = exc.reason
        if self.world > 1:
            said = [refusal]
            dist.broadcast_object_list(said, src=0)
            refusal = said[0]
        if refusal:
            raise ConfigError("out_dir", refusal)
        self._out_dir_lock = Path(self.run.out_dir)

    def release_out_dir(self) -> None:
        if self._out_dir_lock is not None and self.rank == 0:
            run_dir.release(self._out_dir_lock)
        self._out_dir_lock = None

    @contextlib.contextmanager
    def _writing(self, what: str):
        """Around a write of the run's files: an OSError (a full or read-only disk, a permission, an I/O
        error) becomes a `flashlab.train.run_dir.RunFilesError` whose one line says ``what`` failed, the
        last good checkpoint and the command that resumes from it."""
        try:
            yield
        except run_dir.RunFilesError:
            raise
        except OSError as exc:
            out = Path(self.run.out_dir) if self.run.out_dir else None
            resume = None
            if self._last_good is not None and self._last_good[1] < self.run.steps:
                path = self._last_good[0]
                elsewhere = out is not None and path.resolve().parent != out.resolve()
                resume = f"{self.command} --resume {path}" + (f" --out-dir {out}" if elsewhere else "")
            raise run_dir.files_failed(what, exc, self._last_good, resume, out) from exc

    def _refuse_another_runs_out_dir(self, out: Path) -> None:
        """A fresh run (no resume) refuses an out_dir that holds another run, as the command line does:
        its metrics.csv would be cut back to step 0 and checkpoint_last.pt replaced, and the other run's
        checkpoint_<step>.pt files left beside the new run's."""
        held = None if self._out_dir_is_ours else run_held_in(out)
        if held == "checkpoint_last.pt":
            raise ConfigError("out_dir", f"{out} holds a run already ({held}); continue it with resume="
                                         f"'{out / held}', give another out_dir, or delete that one first.")
        found = run_dir.newest_checkpoint(out) if held else None
        if found:                                # killed in its first save of checkpoint_last.pt
            raise ConfigError("out_dir", f"{out} holds a run already, whose save of checkpoint_last.pt was cut short; "
                                         f"its newest complete checkpoint is {found[0]} (step {found[1]}): continue "
                                         f"it with resume='{found[0]}' (or resume='auto'), give another out_dir, or "
                                         f"delete that one first.")
        if held:
            raise ConfigError("out_dir", f"{out} holds a run already ({held}); give another out_dir, or delete that "
                                         f"one first.")

    # ---------------------------------------------------------------- memory
    def _parameter_count(self, task) -> int:
        """Parameters of the model ``task`` describes, built on the meta device (no memory); a deep
        one from its first two layers (10^8 layers would be 10^8 Python objects even there)."""
        def count(task) -> int:
            probe = object.__new__(type(self))
            probe.task_config, probe.run = task, self.run
            with torch.device("meta"):
                return sum(p.numel() for p in probe.build_model().parameters())

        layers = getattr(task, "n_layers", 1)
        if layers <= 2:
            return count(task)
        one, two = count(dataclasses.replace(task, n_layers=1)), count(dataclasses.replace(task, n_layers=2))
        return one + (layers - 1) * (two - one)

    def memory_needs(self, task, run, training: bool = True) -> dict[str, float]:
        """Bytes one process of this run holds at least with ``task`` and ``run`` (`flashlab.train.memory`):
        the weights with their gradients and AdamW's two moments, a micro-batch's activations that the
        backward keeps (the block inputs and the MLP's hidden layer; the float32 logits and their
        gradient), naive attention's scores, and on a CPU the step's token ids. Without ``training``, what
        building the trainer allocates: the weights. A task with another model or batch overrides it."""
        weight = self.precision.param_dtype.itemsize
        if not training:
            return {"weights": weight * self._parameter_count(task)}
        act = self.precision.compute_dtype.itemsize
        micro = max(1, run.batch_size // (run.grad_accum * self.world))
        n, d = task.seq_len, task.d_model
        kept = 1 if task.checkpoint_blocks else 5                   # d-wide values kept per token and block
        needs = {"weights, gradients and AdamW's moments": 4 * weight * self._parameter_count(task),
                 "a micro-batch's activations": micro * n * (task.n_layers * kept * d * act + 2 * 4 * task.vocab_size)}
        if task.attention == "naive":
            needs["naive attention's scores"] = 2 * act * micro * task.n_heads * n * n
        if self.device.type == "cpu":
            needs["the step's token ids"] = 2 * 8 * run.batch_size * n
        return needs

    def check_memory(self) -> None:
        """Raise `ConfigError` (on the setting that costs most) if training would need more memory than
        the device has free (`memory_needs`); `fit` checks it before its first step, the command line before
        it says anything. Building the trainer checked its weights alone: a trainer built to hold a model,
        never to train it, needs no more."""
        self._check_memory(training=True)

    def _check_memory(self, training: bool) -> None:
        """Refuse (`ConfigError` on the setting that costs most) what `memory_needs` says exceeds the free
        memory of the device, before it is allocated: processes of a torchrun job on one CPU count together."""
        task, run = self.task_config, self.run
        needs = self.memory_needs(task, run, training)
        copies = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if self.device.type == "cpu" else 1
        free, _ = memory.available_bytes(self.device)
        if copies * sum(needs.values()) <= free:
            return
        without = {}
        for name in self.size_fields:
            config = task if name in {f.name for f in dataclasses.fields(task)} else run
            default = next(f.default for f in dataclasses.fields(config) if f.name == name)
            if getattr(config, name) == default:
                continue
            try:                         # the estimate of a config its own checks may refuse: memory only
                smaller = dataclasses.replace(config, **{name: default})
                without[name] = sum(self.memory_needs(*((smaller, run) if config is task else (task, smaller)),
                                                      training).values())
            except (ValueError, ZeroDivisionError, RuntimeError):
                continue
        name = memory.most_costly(sum(needs.values()), without) or "batch_size"
        value = getattr(task if hasattr(task, name) else run, name)
        memory.check_fits(needs, self.device, (name, value), copies)

    def _time_is_up(self) -> bool:
        """Training has taken run.time_limit_min (0: no limit), counted across resumes."""
        return bool(self.run.time_limit_min) and self.train_seconds >= 60 * self.run.time_limit_min

    @property
    def config(self):
        """The task config (kept for reading: ``trainer.config.seq_len``)."""
        return self.task_config

    # ---------------------------------------------------------------- what a task changes
    def build_task(self):
        c = self.task_config
        return AssociativeRecall(c.seq_len, c.num_pairs, c.vocab_size, c.query_rate)

    def build_model(self) -> torch.nn.Module:
        c = self.task_config
        return CausalTransformer(c.vocab_size, c.seq_len, c.d_model, c.n_layers, c.n_heads, c.attention, c.dropout,
                                 c.checkpoint_blocks, c.positions, c.rotary_fraction)

    def work_per_step(self) -> int:
        """Units of `work_unit` in one optimizer step (all ranks): tokens here."""
        return self.run.batch_size * self.task_config.seq_len

    def on_step_end(self, metrics: dict) -> None:
        """Called by `fit` after every step (a subclass may evaluate, update a baseline …)."""

    def extra_state(self) -> dict:
        """More state for checkpoints (a subclass's baseline model, …): tensors and plain data."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    # ---------------------------------------------------------------- data and loss
    def global_batch(self, step: int):
        """All rows of step ``step`` (inputs, targets), a function of (seed, step) only."""
        return self.task.batch(self.run.batch_size, self.run.seed * 1_000_003 + step)

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
        logits = self.forward_model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        answered = targets != IGNORE_INDEX
        correct = (logits.argmax(-1) == targets)[answered].sum()
        return loss, correct, answered.sum()

    def _flops_per_step(self) -> float:
        """Model FLOPs of one optimizer step: 6 per parameter per token (forward 2, backward
        4) for the dense layers, plus attention counted as FlashAttention's papers do."""
        c, batch = self.task_config, self.run.batch_size
        dense = 6 * self.model.num_parameters(non_embedding=True) * batch * c.seq_len
        head_dim = c.d_model // c.n_heads
        attn = c.n_layers * attention_flops(batch, c.n_heads, c.seq_len, head_dim, True, "fwd+bwd")
        return dense + attn

    # ---------------------------------------------------------------- one step
    def train_step(self) -> dict:
        run, model = self.run, self.model
        model.train()
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device)
        metric_sum = torch.zeros((), device=self.device)
        metric_count = torch.zeros((), device=self.device)
        for micro in range(run.grad_accum):
            inputs, targets = self.batch(self.step, micro)
            last = micro == run.grad_accum - 1
            sync = self.ddp.no_sync() if (self.ddp is not None and not last) else contextlib.nullcontext()
            with sync:
                with self.precision.autocast(self.device.type):
                    loss, total, count = self.compute_loss(inputs, targets)
                self.scaler.scale(loss / run.grad_accum).backward()   # each micro-batch: 1/accum of the mean
            loss_sum += loss.detach().float()
            metric_sum += total
            metric_count += count
        self.scaler.unscale_(self.optimizer)                        # true gradients before clipping
        clip = run.grad_clip if run.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        stats = torch.stack([loss_sum / run.grad_accum, metric_sum.float(), metric_count.float()])
        if self.world > 1:
            # the same all-reduce carries each rank's wish to stop: a signal it was sent (torchrun forwards
            # SIGTERM and SIGINT to every rank, not at the same instant), and rank 0's clock past the time
            # limit (each rank's clock differs); any one makes every rank stop after this step
            asked = self._stop_requests[0] if self._stop_requests else 0
            time_up = self.rank == 0 and self._time_is_up()
            votes = torch.tensor([float(asked > 0), float(asked), float(bool(time_up))], device=self.device)
            stats = torch.cat([stats, votes])
            dist.all_reduce(stats)
            stats[0] /= self.world
            asking_ranks, signal_sum, time_up = stats[3:].tolist()
            if asking_ranks and not self._stop_requests:          # asked on another rank: stop with it
                sent = round(signal_sum / asking_ranks)               # the signal, unless ranks got different ones
                self._stop_requests.append(sent if sent in (signal.SIGINT, signal.SIGTERM) else signal.SIGTERM)
            self._ranks_agree_to_stop = bool(asking_ranks or time_up)
            stats = stats[:3]
        loss_value, metric_total, metric_n = stats.tolist()
        finite = math.isfinite(loss_value) and math.isfinite(grad_norm.item())
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        if metric_n == 0:
            # nothing to learn from (e.g. documents of one token: no next-token target): no update,
            # which AdamW would still make from its momentum and weight decay; the loss is undefined
            loss_value, finite = float("nan"), False
            self.skipped_steps += 1
        elif finite:
            self.scaler.step(self.optimizer)
            self.bad_in_a_row = 0
        else:                                                        # NaN/inf guard: skip, count
            self.skipped_steps += 1
            self.bad_in_a_row += 1
        self.scaler.update()                                         # 16-mixed: shrink on inf, grow when stable
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():
            # a skipped first step (16-mixed's first loss scale overflows by design) leaves the optimizer
            # unstepped; the schedule moves on regardless, as meant, and PyTorch's warning about it is noise
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        metrics = {"step": self.step, "loss": loss_value,
                   self.metric_name: metric_total / max(metric_n, 1),
                   "grad_norm": grad_norm.item(), "lr": lr, "loss_scale": scale, "skipped": int(not finite),
                   "step_ms": seconds * 1e3, f"{self.work_unit}_per_s": self.work_per_step() / seconds,
                   "mfu": self.flops_per_step / seconds / self.peak if (self.peak and finite and self.flops_per_step)
                   else float("nan")}
        self.step += 1
        # max_bad_steps: the number of consecutive skipped steps that stops the run; 0 turns the stop off
        if run.max_bad_steps and self.bad_in_a_row >= run.max_bad_steps:
            advice = (f"Lower lr, use bf16-mixed instead of {run.precision}, or check the data"
                      if run.precision in ("16-true", "16-mixed") else "Lower lr or check the data")
            raise TrainingDiverged(
                f"{self.bad_in_a_row} consecutive steps had a non-finite loss or gradient norm (last: step "
                f"{self.step - 1}, loss {loss_value}, grad norm {grad_norm.item()}). {advice}; "
                f"max_bad_steps={run.max_bad_steps} set this limit.")
        return metrics

    # ---------------------------------------------------------------- the loop
    def fit(self) -> list[dict]:
        """Train until run.steps (or the time limit, or a signal), holding run.out_dir throughout."""
        self.check_memory()
        run = self.run
        out = Path(run.out_dir) if run.out_dir else None
        took_out_dir = out is not None and self._out_dir_lock is None      # else the caller holds it (the CLI)
        self.hold_out_dir()                      # one run at a time in out_dir, until this fit ends
        try:
            return self._fit_holding_out_dir(run, out)
        finally:
            if took_out_dir:
                self.release_out_dir()

    def _fit_holding_out_dir(self, run, out) -> list[dict]:
        from tqdm.auto import tqdm

        if out and self.rank == 0:
            self._refuse_another_runs_out_dir(out)
            with self._writing(f"creating {out}"):
                out.mkdir(parents=True, exist_ok=True)
            # a run killed after writing rows past its last checkpoint redoes those steps: drop their rows
            with self._writing(f"cutting {out / 'metrics.csv'} back to step {self.step}"):
                _truncate_csv(out / "metrics.csv", self.step)
            # and one killed mid-save left a temporary file, which a save to the same name would remove, but
            # checkpoint_<step>.pt names do not repeat
            with self._writing(f"removing the temporary files of interrupted saves in {out}"):
                checkpoint.remove_interrupted_writes(out, "checkpoint_*.pt")
        self._out_dir_is_ours = True             # a later fit() of this trainer continues its own run
        bar = tqdm(total=run.steps, initial=min(self.step, run.steps), disable=not run.progress or self.rank != 0,
                   desc=f"train {run.precision} {self.task_config.attention}")
        rate_label = {"tokens": "tok/s", "instances": "inst/s"}.get(self.work_unit, f"{self.work_unit}/s")

        def last_saved():
            return out / "checkpoint_last.pt" if out and (out / "checkpoint_last.pt").is_file() else None

        self._ranks_agree_to_stop = False
        try:
            with _stop_between_steps(threading.current_thread() is threading.main_thread(), last_saved) as stop:
                self._stop_requests = stop
                try:
                    self._fit_steps(run, out, bar, rate_label, stop)
                finally:
                    self._stop_requests = []
        finally:
            bar.close()                          # its line ends before any error is said
        if out:
            self.save(out / "checkpoint_last.pt")
        if stop:
            saved = out / "checkpoint_last.pt" if out else None
            raise TrainingInterrupted(signal.Signals(stop[0]).name, self.step, saved)
        return self.history

    def _fit_steps(self, run, out, bar, rate_label, stop) -> None:
        """`fit`'s loop: steps until run.steps, the time limit, or a signal in ``stop``."""
        # one process stops where it was asked to; ranks of a distributed run stop where they all agree, after
        # the step whose all-reduce told each of them (`train_step`), or they would wait for each other forever
        while self.step < run.steps and not (self._ranks_agree_to_stop if self.world > 1 else stop):
            if self.world == 1 and self._time_is_up():
                break
            started = self.clock()
            metrics = self.train_step()
            self.on_step_end(metrics)
            self.train_seconds += self.clock() - started
            metrics["train_seconds"] = self.train_seconds
            self.history.append(metrics)
            if out and self.rank == 0:
                with self._writing(f"appending step {metrics['step']} to {out / 'metrics.csv'}"):
                    _append_csv(out / "metrics.csv", metrics)
            if metrics["step"] % run.log_every == 0 or self.step == run.steps:
                postfix = {"loss": f"{metrics['loss']:.3f}", self.metric_name: f"{metrics[self.metric_name]:.3g}",
                           rate_label: f"{metrics[f'{self.work_unit}_per_s']:.3g}"}
                if not math.isnan(metrics["mfu"]):
                    postfix["MFU"] = f"{metrics['mfu']:.1%}"
                bar.set_postfix(postfix)
            bar.update(1)
            if out and run.checkpoint_every and self.step % run.checkpoint_every == 0:
                self.save([out / f"checkpoint_{self.step}.pt", out / "checkpoint_last.pt"])
                if run.keep_checkpoints and self.rank == 0:
                    with self._writing(f"removing checkpoints older than the newest {run.keep_checkpoints} in {out}"):
                        _prune_checkpoints(out, run.keep_checkpoints)

    # ---------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """Everything a resumed run needs to continue exactly: tensors and plain data."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "step": self.step, "skipped_steps": self.skipped_steps, "bad_in_a_row": self.bad_in_a_row,
                "history": self.history, "train_seconds": self.train_seconds, "rng_cpu": torch.get_rng_state(),
                "rng_cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else None,
                "extra": self.extra_state()}

    def save(self, paths) -> None:
        """Write the training state to ``paths`` (one or several), atomically (rank 0 writes). A failed
        write raises `flashlab.train.run_dir.RunFilesError`, naming the last good checkpoint."""
        if self.rank != 0:
            return
        config = {"task": dataclasses.asdict(self.task_config), "run": dataclasses.asdict(self.run)}
        # the device the run trained on (cpu or cuda): a resume elsewhere tells a GPU run's settings from a choice
        data = checkpoint.encode(self.checkpoint_kind, config, self.state(), metadata={"device": self.device.type})
        for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
            with self._writing(f"saving {path}"):
                checkpoint.write_atomically(path, data)
            self._last_good = (Path(path), self.step)

    def load(self, path) -> None:
        """Restore a training state saved by `save`, after checking that it comes from the same
        model and task: every "fixed" field (`flashlab.train.config.option`) must match, and the
        error lists each one that does not. Fixed: the model's shape (d_model, n_layers,
        n_heads, positions, rotary_fraction; TSP: n_nodes, ff_dim, tanh_clip …), the task's
        identity (num_pairs, vocab_size; TSP: epoch_steps, eval_instances), seed and
        precision; seq_len too with learned positions. Everything else may change and takes
        effect: steps, time limit, batch size and accumulation, lr, weight decay, beta2,
        warm-up and decay (applied to the restored optimizer and scheduler), clipping,
        max_bad_steps, logging, checkpointing, device, attention, dropout, query_rate."""
        try:
            saved = checkpoint.load(path, kind=self.checkpoint_kind, map_location=self.device)
            self.check_saved_config(path, saved.config)            # as a whole: settings, weights, the rest
        except checkpoint.CheckpointError as exc:
            raise ConfigError("resume", str(exc).removeprefix("checkpoint: ")) from None
        mismatches = (self.task_config.resume_mismatches(saved.config["task"])
                      + resume_mismatches(self.run, saved.config["run"]))
        if mismatches:
            raise ConfigError("resume", f"{path} comes from a different run: {'; '.join(mismatches)}. Give the "
                                        f"checkpoint's values, or start a new run without resume.")
        state = saved.state
        try:
            step = state.get("step") if isinstance(state, dict) else None
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise checkpoint.CheckpointError(f"checkpoint: {path} holds no step count; the file is damaged or "
                                                 f"was not written by flashlab.")
            checkpoint.check_weights(path, "model", state.get("model"), self.model)
            self.check_extra_state(path, state.get("extra"))
        except checkpoint.CheckpointError as exc:
            raise ConfigError("resume", str(exc).removeprefix("checkpoint: ")) from None
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
            self.step, self.skipped_steps = state["step"], state["skipped_steps"]
            self.bad_in_a_row = state.get("bad_in_a_row", 0)
            self.train_seconds = float(state["train_seconds"])
            self.history = list(state["history"])
            self.load_extra_state(state["extra"])
            torch.set_rng_state(state["rng_cpu"].cpu())
            if state["rng_cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all([s.cpu() for s in state["rng_cuda"]])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError("resume", f"{path} holds a training state this run cannot restore ({type(exc).__name__}: "
                                        f"{first}); the file is damaged or was not written by flashlab: resume from "
                                        f"another checkpoint.") from None
        self._apply_run_settings()

    @classmethod
    def check_saved_config(cls, path, config) -> None:
        """Raise `flashlab.train.checkpoint.CheckpointError` unless a training state's settings
        (``{"task": …, "run": …}``) pass the checks the command line applies to its options: the
        task's fields and their consistency (`task_config_class`), the run's fields."""
        if not isinstance(config, dict) or not all(isinstance(config.get(k), dict) for k in ("task", "run")):
            raise checkpoint.CheckpointError(f"checkpoint: {path} holds no task and run settings; the file is damaged "
                                             f"or was not written by flashlab.")
        for key, config_class, whole in (("task", cls.task_config_class, True), ("run", RunConfig, False)):
            problem = stored_problem(config_class, config[key], whole)
            if problem:
                raise checkpoint.CheckpointError(f"checkpoint: {path} holds {key} settings no run can have "
                                                 f"({problem}); the file is damaged or was not written by flashlab.")

    def check_extra_state(self, path, extra) -> None:
        """Raise `flashlab.train.checkpoint.CheckpointError` unless ``extra`` (a checkpoint's
        `extra_state`) can be restored; a task with extra state checks it."""

    def _apply_run_settings(self) -> None:
        """Put this run's optimisation settings into the restored optimizer and scheduler (whose
        state dicts carry the old ones): the learning rate at the current step follows the
        new lr, warm-up, decay and step count."""
        run = self.run
        self.scheduler.base_lrs = [run.lr] * len(self.optimizer.param_groups)
        factor = lr_factor(self.scheduler.last_epoch, run.warmup_steps, run.steps, run.min_lr_ratio)
        for group, decay in zip(self.optimizer.param_groups, (run.weight_decay, 0.0)):
            group.update(initial_lr=run.lr, lr=run.lr * factor, weight_decay=decay,
                         betas=(group["betas"][0], run.adam_beta2))
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def evaluate(self, batches: int = 4, seed: int = 10**9) -> float:
        """Recall accuracy on fresh batches (seeds far from the training seeds)."""
        (everything,) = self.evaluate_by_lookback((0, 2**62), batches, seed)     # one bucket: all answers
        return everything["accuracy"]

    @torch.no_grad()
    def evaluate_by_lookback(self, edges=(0, 64, 512, 4096, 32768, 2**31), batches: int = 4,
                             seed: int = 10**9, task: AssociativeRecall | None = None,
                             rows: int | None = None) -> list[dict]:
        """Recall accuracy on fresh batches, split by how far back the queried key was last
        mentioned (`flashlab.train.tasks.lookback`): one row per bucket [lo, hi) of ``edges`` with
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


def _check_writable_dir(directory) -> None:
    """Make sure ``directory`` takes a new file, or can be created, before training; created by
    `fit` only, so that a run refused after this check (a checkpoint of another run …) leaves
    no empty directory behind."""
    target = Path(directory).absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())   # where a file or mkdir would go
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, f"{existing} is a file")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ConfigError("out_dir", f"cannot write to {directory} ({exc.strerror or exc}); give a directory you "
                                     f"can write to.") from None


def _csv_rows(path: Path) -> tuple[list[str] | None, list[list[str]]]:
    if not path.exists():
        return None, []
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return (rows[0], rows[1:]) if rows else (None, [])


def _csv_header(path: Path) -> list[str] | None:
    if not path.exists():
        return None
    with path.open(newline="") as f:
        return next(csv.reader(f), None)


def run_held_in(out_dir) -> str | None:
    """The file that shows ``out_dir`` holds a run (checkpoint_last.pt; else a checkpoint_<step>.pt, left by a
    run killed in its first save of checkpoint_last.pt; else metrics.csv: a run stopped before its first
    checkpoint), or None: what a fresh run refuses to write over (`Trainer.fit`, the command line)."""
    out = Path(out_dir)
    if (out / "checkpoint_last.pt").exists():
        return "checkpoint_last.pt"
    numbered = sorted(out.glob("checkpoint_*.pt"))
    if any(p.stem.removeprefix("checkpoint_").isdigit() for p in numbered):
        return next(p.name for p in numbered if p.stem.removeprefix("checkpoint_").isdigit())
    return "metrics.csv" if (out / "metrics.csv").exists() else None


def _truncate_csv(path: Path, step: int) -> None:
    """Keep only the complete rows of steps before ``step`` (a resumed run writes the rest
    again; a fresh run, step 0, starts the file over). Rewritten atomically."""
    if step == 0:
        path.unlink(missing_ok=True)
        return
    header, rows = _csv_rows(path)
    if header is None:
        return
    column = header.index("step")
    keep = [r for r in rows if len(r) == len(header) and r[column] and float(r[column]) < step]
    if len(keep) == len(rows):
        return
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *keep])
    checkpoint.write_atomically(path, buffer.getvalue().encode())


def _prune_checkpoints(out: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoint_<step>.pt in ``out`` (by step; checkpoint_last.pt
    and any other file stay)."""
    numbered = []
    for path in out.glob("checkpoint_*.pt"):
        step = path.stem.removeprefix("checkpoint_")
        if step.isdigit():
            numbered.append((int(step), path))
    for _, path in sorted(numbered)[:-keep]:
        path.unlink(missing_ok=True)


def _append_csv(path: Path, metrics: dict) -> None:
    # Columns are fixed by the file's header (a resumed run appends to the same file);
    # a metric the header lacks is an error rather than a silently shifted column. Only the
    # header line is read: reading the whole file on every step made a run quadratic (15,000
    # TSP steps spent as long appending rows as training).
    header = _csv_header(path)
    size = path.stat().st_size if path.exists() else None
    try:
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header or list(metrics), restval="", extrasaction="raise")
            if not header:
                writer.writeheader()
            writer.writerow(metrics)
    except OSError:                      # a full disk mid-row: the file as it was, no half row
        with contextlib.suppress(OSError):
            if size is None:
                path.unlink(missing_ok=True)
            else:
                os.truncate(path, size)
        raise


def split_flat_config(flat: dict, task_class=RecallConfig) -> tuple:
    """(task config, RunConfig) from one flat dict of settings, as the first flashlab wrote
    them (a recorded run's JSON): each key goes to the config that has that field; a key
    neither has is an error."""
    task, run = apply_changes((task_class(), RunConfig()), flat)
    return task, run


def train(task: RecallConfig | None = None, run: RunConfig | None = None, **changes) -> Trainer:
    """Train ``task`` with ``run`` (defaults for either) updated by ``changes`` (any field of
    either config, by name); returns the Trainer."""
    task, run = apply_changes((task or RecallConfig(), run or RunConfig()), changes)
    trainer = Trainer(task, run)
    trainer.fit()
    return trainer


def train_in_phases(task: RecallConfig, run: RunConfig, phases, out_dir):
    """A curriculum: for each ``(name, changes, minutes)`` of ``phases``, train ``task``/``run``
    updated by ``changes`` (sequence length, batch, query rate …) for ``minutes`` more,
    resuming the previous phase's checkpoint (weights, optimizer, step count, clock).
    Yields ``(name, trainer)`` after each phase, to evaluate before the next; metrics and
    checkpoints go to ``out_dir/name``."""
    minutes_so_far, previous = 0.0, None
    for name, changes, minutes in phases:
        minutes_so_far += minutes
        phase_task, phase_run = apply_changes((task, run), {**changes, "out_dir": f"{out_dir}/{name}",
                                                            "time_limit_min": minutes_so_far, "resume": previous})
        trainer = Trainer(phase_task, phase_run)
        trainer.fit()
        previous = f"{out_dir}/{name}/checkpoint_last.pt"
        yield name, trainer


def read_metrics(path) -> list[dict]:
    """The rows of a metrics CSV written by `Trainer.fit`, every value a float (NaN where empty).
    A name ending in ``.gz`` is read through gzip (results/ ships long runs' CSVs compressed)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
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
