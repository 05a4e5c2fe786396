"""REINFORCE with a greedy-rollout baseline for the TSP Attention Model (Kool et al. 2019,
Algorithm 1), run by the flashlab trainer so it gets the precision modes, clipping,
checkpoints, the NaN guard, DDP and the metrics CSV for free.

    loss = mean over instances of (L(sampled tour) − L(baseline's greedy tour)) · log p(sampled tour)

The baseline is a frozen copy of the policy. Every ``epoch_steps`` steps the policy's greedy
tours on a fixed evaluation set are compared with the baseline's; the copy is replaced only
if the policy is better in a one-sided paired t-test at level ``alpha``. Because the baseline
is frozen for a whole epoch, its greedy tours for all of the epoch's instances are computed
at once when the epoch starts (as Kool et al. do), in large batches: the same numbers as
one rollout per step, for a fraction of the kernel launches.

``baseline="shared"`` is POMO's instead (Kwon et al., NeurIPS 2020): each instance's n tours,
one from every city as the first, and each tour's baseline is the mean length of its instance's
n tours. No frozen copy and no rollouts of it; the model then decodes from a given first city,
so it is evaluated (and used) with multi-start greedy.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from . import checkpoint
from .config import ConfigError, FieldsChecked, check_fields, option, resume_mismatches
from .model import ATTENTION
from .trainer import ATTENTION_HELP, RunConfig, Trainer, TrainingDiverged
from .tsp import AttentionModel, model_field, random_instances, rollouts, save_model, shortest_tours, tour_length


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b), by its continued fraction (Lentz's method)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):                                   # the fraction converges fast on this side
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


def student_t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return tail if t < 0 else 1.0 - tail


def shared_baseline_advantage(lengths: torch.Tensor) -> torch.Tensor:
    """POMO's advantage: each tour's length minus the mean length of its instance's tours
    (``lengths (batch, tours)``); every instance's advantages sum to zero."""
    return lengths - lengths.mean(1, keepdim=True)


def paired_t_test_less(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """One-sided paired t-test of H1: mean(a) < mean(b). Returns (t statistic, p-value)."""
    d = (a - b).double()
    n = d.numel()
    sd = d.std().item()
    if sd == 0:
        return (-math.inf, 0.0) if d.mean() < 0 else (math.inf, 1.0)
    t = d.mean().item() / (sd / math.sqrt(n))
    return t, student_t_cdf(t, n - 1)


@dataclass
class TSPConfig(FieldsChecked):
    """The task and the Attention Model: Kool et al.'s setup (3 layers, 8 heads, width 128,
    feed-forward 512, tanh clipping 10). Their optimisation (Adam at 1e-4, constant,
    clipping 1.0, batch 512) is `KOOL_RUN`."""

    n_nodes: int = option(20, "cities per instance", low=3, on_resume="fixed")
    d_model: int = model_field("d_model")              # the architecture: declared once, in tsp.ModelConfig
    n_heads: int = model_field("n_heads")
    n_layers: int = model_field("n_layers")
    ff_dim: int = model_field("ff_dim")
    tanh_clip: float = model_field("tanh_clip")
    attention: str = option("auto", ATTENTION_HELP, choices=("auto", "flashlab", "sdpa", "naive"))
    epoch_steps: int = option(250, "steps between baseline tests (an epoch)", low=1, on_resume="fixed")
    eval_instances: int = option(1000, "instances of the fixed set the baseline's t-test compares on", low=2,
                                 on_resume="fixed")
    alpha: float = option(0.05, "significance level of the one-sided paired t-test", low=0, high=1, low_open=True,
                          high_open=True)
    rollout_batch: int = option(8192, "instances per batch when the baseline rolls out a whole epoch", low=1)
    baseline: str = option("rollout", "rollout: Kool et al.'s, a frozen copy's greedy tour, the copy replaced after "
                                      "the t-test; shared: POMO's, n tours per instance from every city as the first, "
                                      "each against their mean (evaluated by multi-start greedy)",
                           choices=("rollout", "shared"), on_resume="fixed")

    def check(self) -> None:
        check_fields(self)
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", f"{self.n_heads} does not divide d_model={self.d_model}; pick a divisor.")

    def resume_mismatches(self, stored: dict) -> list[str]:
        return resume_mismatches(self, stored)


# Kool et al.'s optimisation: Adam (β2 = 0.999, torch's default) at a constant 1e-4, no weight
# decay, gradient clipping 1.0, 512 instances per step.
KOOL_RUN = RunConfig(batch_size=512, lr=1e-4, adam_beta2=0.999, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0)


class TSPTrainer(Trainer):
    """The flashlab Trainer with REINFORCE for the Attention Model: ``TSPTrainer(TSPConfig(…),
    KOOL_RUN)``. The per-step metric is the mean length of the sampled tours; the work per
    step, instances."""

    task_config_class = TSPConfig
    checkpoint_kind = "tsp-training-state"
    command = "train-tsp"
    metric_name = "tour_length"
    work_unit = "instances"
    size_fields = ("n_nodes", "d_model", "ff_dim", "n_layers", "batch_size", "epoch_steps", "eval_instances",
                   "rollout_batch")

    def __init__(self, task: TSPConfig | None = None, run: RunConfig | None = None):
        super().__init__(task, KOOL_RUN if run is None else run)

    def build_task(self):
        c = self.task_config
        self.eval_coords = random_instances(c.eval_instances, c.n_nodes, seed=-(self.run.seed + 1) % 2**31)
        return None

    def work_per_step(self) -> int:
        return self.run.batch_size

    def build_model(self):
        c = self.task_config
        model = AttentionModel(c.d_model, c.n_heads, c.n_layers, c.ff_dim, c.tanh_clip, ATTENTION[c.attention])
        self.baseline = copy.deepcopy(model).eval()
        self.baseline_updates = 0
        self._epoch = None                       # (epoch index, its instances, the baseline's tour lengths)
        return model

    def _flops_per_step(self) -> float:
        return 0.0                                # decoding is sequential: MFU is not meaningful here

    def memory_needs(self, task, run, training: bool = True) -> dict[str, float]:
        """Bytes one process holds at least (`flashlab.train.memory`): the policy with its gradients and
        AdamW's moments, and the baseline; the encoder's activations of a micro-batch and the decoder's
        log-probabilities, a (micro-batch, n) tensor at each of n steps, kept for REINFORCE's backward; an
        epoch's instances, which the baseline rolls out at once; the fixed evaluation set. Without
        ``training``, what building the trainer allocates: policy, baseline and evaluation set."""
        weight = self.precision.param_dtype.itemsize
        if not training:
            return {"the policy and the baseline": 2 * weight * self._parameter_count(task),
                    "the evaluation set": task.eval_instances * task.n_nodes * 2 * 4}
        act = self.precision.compute_dtype.itemsize
        micro = max(1, run.batch_size // (run.grad_accum * self.world))
        n, d = task.n_nodes, task.d_model
        return {"weights, gradients, AdamW's moments and the baseline": 5 * weight * self._parameter_count(task),
                "a micro-batch's encoder activations": micro * n * task.n_layers * (d + task.ff_dim) * act,
                "the decoder's log-probabilities of a micro-batch": 2 * 4 * micro * n * n,
                "an epoch's instances": task.epoch_steps * run.batch_size * n * (2 * 4 + 4),
                "the baseline's rollout of a batch": min(task.rollout_batch, task.epoch_steps * run.batch_size) * n * d
                * act,
                "the evaluation set": task.eval_instances * n * 2 * 4}

    def global_batch(self, step):
        """Step ``step``'s instances (a function of seed and step) and the baseline's greedy tour
        lengths on them, which stand where a language model's targets would."""
        c, batch, seed = self.task_config, self.run.batch_size, self.run.seed
        if c.baseline == "shared":                # the baseline is in the step's own tours: nothing to roll out
            return random_instances(batch, c.n_nodes, seed * 1_000_003 + step), None
        epoch = step // c.epoch_steps
        if self._epoch is None or self._epoch[0] != epoch:
            steps = range(epoch * c.epoch_steps, (epoch + 1) * c.epoch_steps)
            if self.run.progress and self.rank == 0:
                from tqdm.auto import tqdm
                # on a CPU with the defaults (Kool et al.'s 250 × 512) this takes a minute before step 1
                tqdm.write(f"epoch {epoch}: the baseline's greedy tours for its {len(steps)} steps × {batch} "
                           f"instances (--epoch-steps × --batch-size), rolled out once, before its steps")
            coords = torch.stack([random_instances(batch, c.n_nodes, seed * 1_000_003 + s) for s in steps])
            lengths = self._greedy_lengths(self.baseline, coords.flatten(0, 1), c.rollout_batch)
            self._epoch = (epoch, coords, lengths.view(len(steps), batch).cpu())
        i = step - epoch * c.epoch_steps
        return self._epoch[1][i], self._epoch[2][i]

    def compute_loss(self, coords, baseline_lengths):
        if self.task_config.baseline == "shared":
            return self.shared_baseline_loss(coords)
        tours, log_p = self.forward_model(coords, "sample")
        lengths = tour_length(coords, tours)
        loss = ((lengths - baseline_lengths) * log_p).mean()           # REINFORCE with a baseline
        return loss, lengths.sum(), torch.tensor(len(lengths), device=lengths.device)

    def shared_baseline_loss(self, coords):
        """POMO: a sampled tour from every city as the first; each tour's advantage is its length
        minus the mean of its instance's n (`shared_baseline_advantage`)."""
        batch, n, _ = coords.shape
        tours, log_p = self.forward_model(coords, "sample", multi_start=True)          # (batch · n, n)
        lengths = tour_length(coords.repeat_interleave(n, dim=0), tours).view(batch, n)
        loss = (shared_baseline_advantage(lengths) * log_p.view(batch, n)).mean()
        return loss, lengths.sum(), torch.tensor(lengths.numel(), device=lengths.device)

    def _greedy_lengths(self, model, coords, batch_size, multi_start: bool = False) -> torch.Tensor:
        """Greedy tour lengths, or with ``multi_start`` the shortest of the n multi-start greedy
        tours of each instance (``batch_size`` tours decoded at once)."""
        coords = coords.to(self.device)
        model.to(self.device)
        n = coords.shape[1]
        with self.precision.autocast(self.device.type):
            if multi_start:
                model.eval()
                tours = torch.cat([rollouts(model, part, starts=n) for part in coords.split(max(1, batch_size // n))])
            else:
                tours = model.greedy_tours(coords, batch_size=batch_size)[:, None]      # (instances, tours, n)
        if not bool((tours.sort(-1).values == torch.arange(n, device=tours.device)).all()):
            # a non-finite embedding makes every log-probability NaN, and argmax then repeats a city
            raise TrainingDiverged(
                f"the greedy rollout at step {self.step} repeated cities: the model's activations are no longer "
                f"finite in {self.run.precision} ({next(model.parameters()).dtype} weights; float16 overflows "
                "past 65504). "
                "Use bf16-mixed (or 16-mixed, which scales the loss), or lower lr.")
        return shortest_tours(coords, tours)[1]

    def greedy_lengths(self, model) -> torch.Tensor:
        """Greedy tour lengths of ``model`` on the fixed evaluation set; with the shared baseline,
        multi-start greedy's (its training never decodes the first step's placeholder)."""
        shared = self.task_config.baseline == "shared"
        return self._greedy_lengths(model, self.eval_coords, self.task_config.rollout_batch if shared else 1000,
                                    multi_start=shared)

    def on_step_end(self, metrics):
        c = self.task_config
        # every row has the same columns (the metrics CSV); NaN where the epoch has not ended
        metrics.update(baseline_updated=0, eval_tour_length=math.nan, baseline_tour_length=math.nan, t_test_p=math.nan)
        if self.step % c.epoch_steps:
            return
        if c.baseline == "shared":                # no copy to test against: only the evaluation
            metrics["eval_tour_length"] = self.greedy_lengths(self.model).mean().item()
            self.model.train()
            return
        candidate, current = self.greedy_lengths(self.model), self.greedy_lengths(self.baseline)
        self.model.train()
        t, p = paired_t_test_less(candidate, current)
        metrics.update(eval_tour_length=candidate.mean().item(), baseline_tour_length=current.mean().item(),
                       t_test_p=p)
        if candidate.mean() < current.mean() and p < c.alpha:
            self.baseline.load_state_dict(self.model.state_dict())
            self.baseline_updates += 1
            self._epoch = None                    # the next epoch's rollouts come from the new baseline
            metrics["baseline_updated"] = 1

    def extra_state(self):
        return {"baseline": self.baseline.state_dict(), "baseline_updates": self.baseline_updates}

    def check_extra_state(self, path, extra) -> None:
        if extra:                                  # the baseline, as the policy: keys, shapes, finite
            if not isinstance(extra, dict) or not isinstance(extra.get("baseline_updates"), int):
                raise checkpoint.CheckpointError(f"checkpoint: {path} holds no baseline update count; the file is "
                                                 f"damaged or was not written by flashlab.")
            checkpoint.check_weights(path, "baseline", extra.get("baseline"), self.baseline)

    def load_extra_state(self, state):
        if state:
            self.baseline.load_state_dict(state["baseline"])
            self.baseline_updates = state["baseline_updates"]
            self._epoch = None

    def evaluate(self, batches: int = 0, seed: int = 0) -> float:
        """Mean greedy tour length on the fixed evaluation set (multi-start with the shared baseline)."""
        return self.greedy_lengths(self.model).mean().item()

    def export(self, path, **metadata):
        """The policy alone, in the format `python -m flashlab eval-tsp` loads."""
        if self.task_config.baseline == "shared":     # its first step's placeholder is untrained
            metadata = {"baseline": "shared: evaluate with --multi-start", **metadata}
        save_model(self.model, path, n_nodes=self.task_config.n_nodes, steps=self.step, **metadata)


def export_policy(state_path, out_path) -> TSPTrainer:
    """Write the policy of a tsp-training-state checkpoint (``checkpoint_last.pt`` or any
    ``checkpoint_<step>.pt``) as the tsp-model checkpoint eval-tsp loads (``am_tspN.pt``), with
    the metadata train-tsp writes when a run ends: for a run stopped from outside (a kill, a
    machine's time limit) that left only its checkpoints. The trainer is rebuilt on the CPU with
    SDPA (nothing runs); returns it (its step and train_seconds say what was exported)."""
    saved = checkpoint.load(state_path, kind="tsp-training-state", map_location="cpu")
    TSPTrainer.check_saved_config(state_path, saved.config)        # the weights are checked as the run resumes
    task = TSPConfig(**{**saved.config["task"], "attention": "sdpa"})
    # nothing runs here, so nothing is compiled (a GPU run's reduce-overhead is refused on a CPU);
    # the metadata still records how the run was compiled
    run = RunConfig(**{**saved.config["run"], "device": "cpu", "resume": str(state_path), "out_dir": None,
                       "progress": False, "compile": "off"})
    try:
        trainer = TSPTrainer(task, run)
    except ConfigError as exc:                 # the training state's own weights or state: a --checkpoint error
        if exc.field != "resume":
            raise
        raise checkpoint.CheckpointError(f"checkpoint: {exc.reason}") from None
    trainer.export(out_path, train_minutes=round(trainer.train_seconds / 60, 2), precision=trainer.run.precision,
                   compile=saved.config["run"].get("compile", "off"))
    return trainer


