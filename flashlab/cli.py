"""Command line: ``python -m flashlab <command>``.

  bench-softmax     time the fused softmax against torch.softmax and the unfused ops
  bench             time flashlab.attention, naive attention, every SDPA backend and
                    FlexAttention: forward, backward, forward+backward, TFLOP/s, extra memory
  train             train the causal transformer on associative recall (flashlab.train.trainer):
                    one option per field of RecallConfig (the task and model) and RunConfig
                    (optimisation and bookkeeping), e.g. --precision bf16-mixed; with
                    --task documents on documents of random lengths, --packing packed or
                    padded (flashlab.train.documents, DocumentsConfig)
  train-tsp         train the TSP Attention Model with REINFORCE (flashlab.train.tsp_train): one
                    option per field of TSPConfig and RunConfig; exports am_tspN.pt to --out-dir
  tune              tune the attention kernels for a list of shapes ahead of training
                    (flashlab.api.pretune; python -m flashlab tune --help)
  eval-tsp          evaluate a TSP Attention Model checkpoint: mean greedy tour length, gap
                    to the published optimum, heuristics; --save-tours writes instances and tours;
                    --multi-start, --augment 8, --samples K: many tours per instance, the shortest
  export-tsp        write the policy of a training-state checkpoint as am_tspN.pt (a run that
                    was killed before its own export)

train and train-tsp write only with --out-dir, never over another run, and one run at a time
(a second run or resume into a directory in use is refused, naming the process that holds it);
Ctrl-C or SIGTERM stops a run between two steps and saves it (--resume continues exactly, and
--resume auto from the newest complete checkpoint in --out-dir; under torchrun every rank stops
after the same step).

Every option is checked before any work starts, sizes against the memory of the device; a bad
one ends the command with one line that names it and says what to give instead (exit status 2).
A file that cannot be written (a full or read-only disk, a permission, an I/O error) ends the
command with one line that says what failed, the last good checkpoint and the command that
resumes from it (exit status 1).
The benchmarks print a table and, with --out, write JSON (GPU name, versions, date, every row).
Data-parallel training: torchrun --nproc_per_node 2 -m flashlab train …
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from flashlab.train import run_dir
from flashlab.train.checkpoint import CheckpointError
from flashlab.train.config import ConfigError, OneLineErrorParser, check_value, describe_range, field_kind
from flashlab.train.run_dir import RunFilesError
from flashlab.train.tsp import EVAL_MAX_ROLLOUTS


class UsageError(Exception):
    """A user error found after parsing: printed as one line, exit status 2."""


# ---------------------------------------------------------------- argument types that check
def _bounded(kind, low=None, high=None, low_open=False):
    """An argparse type: parse as ``kind`` and check the range, naming what to give."""
    meta = {"low": low, "high": high, "low_open": low_open, "high_open": False}

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range; give a value {describe_range(meta)}")
        return value

    parse.__name__ = kind.__name__
    return parse


POSITIVE = _bounded(int, low=1)
NON_NEGATIVE = _bounded(int, low=0)


def _field_type(f):
    kind = field_kind(f)

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        try:
            check_value(f, value)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.reason.rstrip(".")) from None
        return value

    parse.__name__ = kind.__name__
    return parse


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_config_options(parser, config, skip=()) -> None:
    """One option per field of the config dataclass instance ``config``: typed, ranged,
    defaulted from it, with its help line (choices and range included). Fields named in
    ``skip`` already have their option (from another config that declares them alike)."""
    group = parser.add_argument_group(type(config).__name__)
    for f in dataclasses.fields(config):
        if f.name in skip:
            continue
        meta, default, kind = f.metadata, getattr(config, f.name), field_kind(f)
        extra = [f"default: {default}"]
        if describe_range(meta):
            extra.append(describe_range(meta))
        if meta.get("on_resume") == "fixed":
            extra.append("fixed on resume: taken from the checkpoint unless given, and must match it")
        elif f.name not in _NOT_ADOPTED:
            extra.append("on resume: the checkpoint's unless given")
        text = f"{meta['help']} ({'; '.join(extra)})"
        if kind is bool:
            group.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=default, help=text)
        elif meta.get("choices"):
            group.add_argument(_flag(f.name), choices=meta["choices"], default=default, help=text)
        else:
            group.add_argument(_flag(f.name), type=_field_type(f) if kind is not str else str, default=default,
                               metavar=f.name.upper(), help=text)


def _config_from(args, config):
    return dataclasses.replace(config, **{f.name: getattr(args, f.name) for f in dataclasses.fields(config)})


def _check_output_file(option: str, path, create_directory: bool = False, overwrite: bool = False,
                       reading: dict | None = None) -> None:
    """An output file must be writable before any work starts: its directory must exist (or,
    with ``create_directory``, be created now) and accept a new file. An existing file is
    replaced only with ``--overwrite``, and never when it is one of the files the command reads
    (``reading``: option → path): export-tsp --out once replaced the training state it exported
    from, and eval-tsp --save-tours wrote its tours over whatever file it was given."""
    if path is None:
        return
    if path == "":
        raise UsageError(f"{option}: an empty path; give a file name.")
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{option}: {path} is a directory; give a file name.")
    if target.exists():
        for source_option, source in (reading or {}).items():
            if source is not None and Path(source).exists() and target.samefile(source):
                raise UsageError(f"{option}: {path} is the file {source_option} reads, and writing it would destroy "
                                 f"it; give another file name.")
        if not overwrite:
            raise UsageError(f"{option}: {path} exists already; give a new file name, or add --overwrite to replace "
                             f"it.")
    directory = target.resolve().parent
    if not directory.is_dir() and not create_directory:
        raise UsageError(f"{option}: the directory {directory} does not exist; create it or give another path.")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UsageError(f"{option}: cannot write into {directory} ({exc.strerror or exc}); give a path in a "
                         f"directory you can write to.") from None


def _write_failed(option: str, path, exc: OSError) -> RunFilesError:
    """The one line for an output file that could not be written after the work was done."""
    return RunFilesError(f"{option}: writing {path} failed: {exc.strerror or exc}; nothing was written there (the "
                         f"previous file, if any, is intact): fix that, then run the command again.")


def _existing_file(option: str, path) -> None:
    if path == "":
        raise UsageError(f"{option}: an empty path; give the path of a checkpoint (.pt).")
    if path is not None and not Path(path).is_file():
        raise UsageError(f"{option}: {path} does not exist or is not a file; give the path of a checkpoint (.pt).")


# ---------------------------------------------------------------- bench-softmax, bench
# The benchmarks' sizes are a GPU's. Without one, Triton's interpreter runs the kernels, hundreds of
# times slower than compiled: bench's GPU sizes would take hours there, bench-softmax's minutes. So
# on a CPU the sizes not given on the command line are small ones (bench: 34 s, bench-softmax:
# about 20 s on the course's CPU), and one line says so.
CPU_SIZES = {"bench-softmax": {"rows": 256},
             "bench": {"seq_lens": [64, 128], "head_dims": [64], "tokens": 256, "heads": 2, "dtypes": ["bfloat16"]}}


def _sizes_for_this_machine(command: str, args) -> None:
    """Options left at None (not given) get the GPU's defaults on a GPU, `CPU_SIZES` on a CPU."""
    gpu = torch.cuda.is_available()
    chosen = []
    for name, cpu_value in CPU_SIZES[command].items():
        if getattr(args, name) is None:
            value = args.gpu_defaults[name] if gpu else cpu_value
            setattr(args, name, value)
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            chosen.append(f"--{name.replace('_', '-')} {shown}")
    if not gpu and chosen:
        print(f"{command}: no GPU, so Triton's interpreter runs flashlab's kernels, hundreds of times slower than "
              f"compiled (their times here are the interpreter's); CPU sizes: {', '.join(chosen)}. Give the options "
              "to choose (see --help).", file=sys.stderr)


def _softmax_options(p) -> None:
    p.add_argument("--rows", type=POSITIVE, default=None,
                   help=f"rows of each matrix (default 4096 on a GPU, {CPU_SIZES['bench-softmax']['rows']} on a CPU)")
    p.set_defaults(gpu_defaults={"rows": 4096})
    p.add_argument("--cols", type=POSITIVE, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384],
                   help="row lengths to time (default 256 … 16384)")
    p.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16",
                   help="element type (default float16)")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (refused otherwise)")


def _bench_softmax(args) -> None:
    _check_output_file("--out", args.out, create_directory=True, overwrite=args.overwrite)
    _sizes_for_this_machine("bench-softmax", args)
    from flashlab.bench.records import environment
    from flashlab.bench.softmax import benchmark_softmax

    dtype = getattr(torch, args.dtype)
    rows = benchmark_softmax(args.rows, args.cols, dtype)
    record = {"environment": environment(), "rows": rows}
    text = json.dumps(record, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    for r in rows:
        print(f"{r['cols']:>6} {r['impl']:>24} {r['ms']:9.4f} ms {r['GB/s']:8.1f} GB/s")


def _attention_bench_options(p) -> None:
    p.add_argument("--seq-lens", type=POSITIVE, nargs="+", default=None,
                   help="sequence lengths N (default 512 … 16384 on a GPU, 64 128 on a CPU)")
    p.add_argument("--head-dims", type=POSITIVE, nargs="+", default=None,
                   help="head dimensions D (default 64 128 on a GPU, 64 on a CPU)")
    p.add_argument("--masks", nargs="+", choices=["full", "causal"], default=["full", "causal"],
                   help="attention masks (default both)")
    p.add_argument("--dtypes", nargs="+", choices=["float16", "bfloat16"], default=None,
                   help="element types (default both on a GPU, bfloat16 on a CPU)")
    p.add_argument("--tokens", type=POSITIVE, default=None,
                   help="B·N, kept constant across N (default 16384 on a GPU, 256 on a CPU)")
    p.add_argument("--heads", type=POSITIVE, default=None, help="attention heads H (default 16 on a GPU, 2 on a CPU)")
    p.set_defaults(gpu_defaults={"seq_lens": [512, 1024, 2048, 4096, 8192, 16384], "head_dims": [64, 128],
                                 "tokens": 16384, "heads": 16, "dtypes": ["bfloat16", "float16"]})
    p.add_argument("--flex-seq-lens", type=POSITIVE, nargs="*", default=None,
                   help="run FlexAttention (compiled per shape) only at these N (default: all)")
    p.add_argument("--warmup-ms", type=NON_NEGATIVE, default=25,
                   help="warm-up time per measurement (default 25; on a CPU at least one call)")
    p.add_argument("--rep-ms", type=POSITIVE, default=100,
                   help="measuring time per measurement (default 100; on a CPU at least 5 calls, each timed)")
    p.add_argument("--out", help="write the results as JSON to this file (rewritten after every row)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (refused otherwise)")


def _bench_attention(args) -> None:
    _check_output_file("--out", args.out, create_directory=True, overwrite=args.overwrite)
    _sizes_for_this_machine("bench", args)
    from flashlab.bench.attention import benchmark_attention
    from flashlab.bench.records import environment
    from flashlab.launch import autotune

    env = environment()

    def save(rows):
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"environment": env, "rows": rows,
                                                  "autotune": autotune.tuner.report()}, indent=1))

    rows = benchmark_attention(args.seq_lens, args.head_dims, tuple(c == "causal" for c in args.masks),
                               tuple(getattr(torch, d) for d in args.dtypes), tokens=args.tokens, heads=args.heads,
                               flex_seq_lens=args.flex_seq_lens, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                               on_progress=save)
    for r in rows:
        speed = f"{r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s" if "ms" in r else f"error: {r['error'][:60]}"
        if r.get("extra_bytes") is not None:
            speed += f" {r['extra_bytes'] / 2**20:9.1f} MiB extra"
        print(f"{r['impl']:>15} N={r['N']:>6} D={r['D']:>3} causal={r['causal']!s:5} {r['dtype']:>14} "
              f"{r['mode']:>7} {speed}")


# ---------------------------------------------------------------- train, train-tsp
TASKS = {"recall": ("flashlab.train.trainer", "RecallConfig", "Trainer", "lm-training-state"),
         "documents": ("flashlab.train.documents", "DocumentsConfig", "DocumentsTrainer", "documents-training-state")}


def _task_classes(task: str):
    """(config class, trainer class) of ``train --task``."""
    import importlib
    module_name, config_name, trainer_name, _ = TASKS[task]
    module = importlib.import_module(module_name)
    return getattr(module, config_name), getattr(module, trainer_name)


def _field_names(config_class) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class)}


def _train_options(p) -> None:
    from flashlab.train.documents import DocumentsConfig
    from flashlab.train.trainer import RecallConfig, RunConfig

    p.add_argument("--task", choices=tuple(TASKS), default="recall",
                   help="recall: associative recall (RecallConfig); documents: documents of random lengths, packed "
                        "or padded (DocumentsConfig: its own options below, and the model options of RecallConfig "
                        "they share). Default recall; on resume, the checkpoint's task")
    _add_config_options(p, RecallConfig())
    _add_config_options(p, DocumentsConfig(), skip=_field_names(RecallConfig))
    _add_config_options(p, RunConfig())


def _tsp_train_options(p) -> None:
    from flashlab.train.tsp_train import KOOL_RUN, TSPConfig

    _add_config_options(p, TSPConfig())
    _add_config_options(p, KOOL_RUN)


# Settings of the machine and the terminal, not of the run: on resume they keep this invocation's
# value (a run trained with --device cuda may be resumed on another machine). Two more follow the
# machine where no GPU runs (`_adopt_from_checkpoint`): compile reduce-overhead, and attention flashlab.
_NOT_ADOPTED = {"resume", "device", "progress"}
# A GPU run's settings that a resume without a GPU does not take (each: the value, and why, said in
# one line): CUDA graphs cannot replay, and the kernels would run in Triton's interpreter (hours for
# a few steps). A run that trained on a CPU keeps its attention: flashlab there was a choice.
_GPU_SETTINGS = {
    "attention": ("flashlab", " (sdpa here), as {why} and flashlab's kernels would run in Triton's interpreter; "
                              "give --attention flashlab to keep them"),
    "compile": ("reduce-overhead", ", as reduce-overhead replays CUDA graphs and {why}"),
}


def _adopt_from_checkpoint(args, task, run, trainer_class):
    """On resume the run continues as it was: every setting not given on the command line is the
    checkpoint's (model, task, seed, precision, and also batch size, learning rate, schedule, …),
    except this machine's (`_NOT_ADOPTED`, a compile of reduce-overhead where no GPU runs it, and a
    GPU run's flashlab attention where no GPU runs its kernels).
    Given settings override the free ones (one line says what changed) and must equal the fixed
    ones (checked by the Trainer)."""
    from flashlab.train import checkpoint
    from flashlab.train.trainer import no_cuda_graphs

    saved = checkpoint.load(run.resume, kind=trainer_class.checkpoint_kind)   # another command's checkpoint: said first
    trainer_class.check_saved_config(run.resume, saved.config)     # a bad stored setting is the file's, not an option's
    stored = saved.config
    configs, changed = [], []
    why = no_cuda_graphs(run.device)
    metadata = saved.metadata if isinstance(saved.metadata, dict) else {}
    state = saved.state if isinstance(saved.state, dict) else {}
    # the device it trained on, where the checkpoint records it; an older one's CUDA RNG state means a GPU was there
    trained_on_gpu = (metadata["device"] == "cuda" if "device" in metadata else state.get("rng_cuda") is not None)
    for config, key in ((task, "task"), (run, "run")):
        names = {f.name for f in dataclasses.fields(config)} - _NOT_ADOPTED
        adopt = {name: value for name, value in stored.get(key, {}).items()
                 if name in names and name not in args.given}
        free = {f.name for f in dataclasses.fields(config) if f.metadata.get("on_resume") != "fixed"}
        given = sorted(names & free & args.given)
        changed += [f"{name} {stored[key][name]} → {getattr(config, name)}" for name in given
                    if name in stored.get(key, {}) and name != "steps" and stored[key][name] != getattr(config, name)]
        for name, (value, because) in _GPU_SETTINGS.items():
            if name == "attention" and not trained_on_gpu:
                continue                               # chosen for a CPU run: kept, as every other setting
            if adopt.get(name) == value and why:      # like the device, a setting of the machine
                del adopt[name]
                changed.append(f"{name} {value} → {getattr(config, name)}{because.format(why=why)}")
        configs.append(dataclasses.replace(config, **adopt))
    step = saved.state.get("step") if isinstance(saved.state, dict) else None
    if isinstance(step, int) and configs[1].steps <= step:
        raise UsageError(f"--steps: the checkpoint is at step {step} already, and --steps {configs[1].steps} asks "
                         f"for no more; give the total to reach, e.g. --steps {step + 100}.")
    return (*configs, changed, step)


def _check_where_to_write(args, run) -> None:
    """Refuse (one line) options that would write nothing, and a copied checkpoint whose continuation
    would go back to the original run: what the paths alone say, before the run takes its directory."""
    if "keep_checkpoints" in args.given and run.keep_checkpoints and not run.checkpoint_every:
        raise UsageError("--keep-checkpoints: it prunes the checkpoint_<step>.pt files that --checkpoint-every "
                         "writes, and no --checkpoint-every is given; add one (and --out-dir DIR).")
    if run.out_dir is None:
        if "checkpoint_every" in args.given and run.checkpoint_every:
            raise UsageError("--checkpoint-every: checkpoints need a directory; add --out-dir DIR.")
        return
    out, resume = Path(run.out_dir), Path(run.resume) if run.resume else None
    if resume and "out_dir" not in args.given and resume.resolve().parent != out.resolve():
        raise UsageError(f"--out-dir: {resume} was saved by the run in {out}, and resuming writes to the run's "
                         f"directory; give --out-dir {resume.parent} to continue beside this file, or --out-dir {out} "
                         f"to continue in that directory.")


def _output_notes(args, run, resumed_step, command: str) -> list[str]:
    """Where the run will write, said before it starts; refused (one line) where writing there
    would overwrite a run. Looked at once the run holds its directory (`_build_trainer`)."""
    from flashlab.train import checkpoint
    from flashlab.train.trainer import run_held_in
    if run.out_dir is None:
        return ["no --out-dir: nothing of this run is saved (no checkpoints, metrics.csv or model); add --out-dir "
                "DIR to keep them."]
    out = Path(run.out_dir)
    last = out / "checkpoint_last.pt"
    if not run.resume:
        held = run_held_in(out)
        if held == last.name:
            raise UsageError(f"--out-dir: {out} holds a run already ({last.name}); continue it with --resume {last}, "
                             f"or give another --out-dir (or delete that one first).")
        found = run_dir.newest_checkpoint(out) if held else None
        if found:                                # killed in its first save of checkpoint_last.pt
            stored = checkpoint.load(found[0]).config.get("run", {}).get("out_dir")
            moved = not stored or Path(stored).resolve() != out.resolve()
            resume = f"python -m flashlab {command} --resume {found[0]}" + (f" --out-dir {out}" if moved else "")
            raise UsageError(f"--out-dir: {out} holds a run already, whose save of {last.name} was cut short; its "
                             f"newest complete checkpoint is {found[0]} (step {found[1]}): continue it with {resume} "
                             f"(or --resume auto --out-dir {out}), or give another --out-dir (or delete that one "
                             f"first).")
        if held:                                 # a run stopped before its first checkpoint: nothing to resume
            raise UsageError(f"--out-dir: {out} holds a run already (metrics.csv, no checkpoint to resume from); "
                             f"give another --out-dir, or delete that one first.")
        return []
    resume = Path(run.resume)
    notes = [f"resume: from step {resumed_step}, writing to {out}"]
    if last.exists() and last.resolve() != resume.resolve():
        try:
            reached = checkpoint.load(last).state.get("step")
        except (CheckpointError, AttributeError):
            reached = None
        if isinstance(reached, int) and isinstance(resumed_step, int) and reached > resumed_step:
            notes.append(f"resume: {out} had reached step {reached}; from here its metrics.csv is cut back to step "
                         f"{resumed_step} and checkpoint_last.pt replaced (checkpoint_<step>.pt files stay)")
    return notes


def _stamp(path):
    """What changes when a file is replaced (a new checkpoint_last.pt is a new inode), or None."""
    try:
        stat = os.stat(path)
    except (OSError, TypeError):
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _resume_auto(args) -> None:
    """``--resume auto``: the newest complete checkpoint in --out-dir, or a new run where there is none."""
    if args.resume != "auto":
        return
    if not args.out_dir:
        raise UsageError("--resume: auto resumes the newest complete checkpoint in --out-dir; add --out-dir DIR.")
    found = run_dir.newest_checkpoint(args.out_dir) if Path(args.out_dir).is_dir() else None
    args.resume = str(found[0]) if found else None
    args.resume_note = (f"resume auto: the newest complete checkpoint in {args.out_dir} is {found[0]} (step "
                        f"{found[1]})" if found else f"resume auto: {args.out_dir} holds no checkpoint: a new run "
                                                        f"starts")


def _build_trainer(trainer_class, args, task, run):
    _existing_file("--resume", run.resume)
    resume_stamp = _stamp(run.resume)
    changed, resumed_step = [], None
    if run.resume:
        try:
            task, run, changed, resumed_step = _adopt_from_checkpoint(args, task, run, trainer_class)
        except CheckpointError as exc:
            raise ConfigError("resume", str(exc).removeprefix("checkpoint: ")) from None
    task.check()
    run.check()
    trainer = trainer_class(task, run)        # checks the checkpoint against the run (fixed settings) first
    trainer.check_memory()                    # what training will hold, against the device's free memory
    _check_where_to_write(args, run)
    # one run at a time in --out-dir (flashlab.train.run_dir), held until the command ends; what the run
    # finds there is looked at once it holds it
    trainer.hold_out_dir()
    if run.resume and _stamp(run.resume) != resume_stamp:
        raise UsageError(f"--resume: {run.resume} was replaced while this run started, by the run that held "
                         f"{run.out_dir} and has ended since; resume again to continue from where that run stopped.")
    notes = _output_notes(args, run, resumed_step, trainer_class.command)
    if getattr(args, "resume_note", None):
        notes.insert(0, args.resume_note)
    if changed:                            # said once the run is accepted (a refused one prints only its error)
        print("resume: changed from the checkpoint: " + "; ".join(changed), flush=True)
    for note in notes:
        print(note, flush=True)
    return trainer


def _chosen_task(args) -> str:
    """``--task``, or on resume without it the task the checkpoint was trained on."""
    if "task" in args.given or not args.resume:
        return args.task
    from flashlab.train import checkpoint
    _existing_file("--resume", args.resume)
    kind = checkpoint.load(args.resume).kind
    return next((task for task, spec in TASKS.items() if spec[3] == kind), args.task)


def _train(args) -> None:
    from flashlab.train.trainer import RunConfig

    _resume_auto(args)
    task = _chosen_task(args)
    config_class, trainer_class = _task_classes(task)
    others = set().union(*(_field_names(_task_classes(t)[0]) for t in TASKS if t != task)) - _field_names(config_class)
    stray = sorted(others & args.given)
    if stray:
        raise UsageError(f"{_flag(stray[0])}: is not a setting of --task {task}; leave it out, or give the --task it "
                         f"belongs to (see --help).")
    trainer = _build_trainer(trainer_class, args, _config_from(args, config_class()), _config_from(args, RunConfig()))
    _say_if_out_of_time(trainer)
    history = trainer.fit()
    if trainer.rank == 0:
        last = history[-1] if history else {}
        if task == "documents":
            # the run's rate, not the last step's (a step's tokens vary with its drawn lengths); the
            # first logged step is left out: it includes compilation and warm-up
            timed = [r for r in history[1:] if r.get("tokens_per_s")] or history
            tokens = sum(r.get("real_tokens", 0) for r in timed)
            seconds = sum(r["real_tokens"] / r["tokens_per_s"] for r in timed if r.get("tokens_per_s"))
            rate = tokens / seconds if seconds else float("nan")
            print(f"steps {trainer.step}, skipped {trainer.skipped_steps}, {trainer.task_config.packing}, last loss "
                  f"{last.get('loss', float('nan')):.4f}, {rate:.0f} real tokens/s (mean of the logged steps after "
                  f"the first), next-token accuracy (held-out) {trainer.evaluate():.3f}")
            return
        print(f"steps {trainer.step}, skipped {trainer.skipped_steps}, last loss {last.get('loss', float('nan')):.4f}, "
              f"recall accuracy (held-out) {trainer.evaluate():.3f}")


def _train_tsp(args) -> None:
    from flashlab.train.trainer import TrainingInterrupted
    from flashlab.train.tsp_train import KOOL_RUN, TSPConfig, TSPTrainer

    _resume_auto(args)
    trainer = _build_trainer(TSPTrainer, args, _config_from(args, TSPConfig()), _config_from(args, KOOL_RUN))
    _say_if_out_of_time(trainer)
    try:
        trainer.fit()
    except TrainingInterrupted:            # stopped between steps and saved: the policy so far is exported too
        _export_tsp(trainer)
        raise
    if trainer.rank == 0:
        minutes = trainer.train_seconds / 60                       # all runs of a resumed job together
        compiled = "" if trainer.run.compile == "off" else f" (compiled: {trainer.run.compile})"
        print(f"steps {trainer.step}{compiled}, {minutes:.1f} min, baseline updates {trainer.baseline_updates}, "
              f"greedy tour length on the evaluation set {trainer.evaluate():.4f}")
        _export_tsp(trainer)


def _export_tsp(trainer) -> None:
    """am_tspN.pt in the run's directory (rank 0, with an out_dir), as eval-tsp loads it."""
    if trainer.rank == 0 and trainer.run.out_dir:
        path = f"{trainer.run.out_dir}/am_tsp{trainer.task_config.n_nodes}.pt"
        try:
            trainer.export(path, train_minutes=round(trainer.train_seconds / 60, 2), precision=trainer.run.precision)
        except OSError as exc:                 # the run is saved; only its policy file is missing
            last = Path(trainer.run.out_dir) / "checkpoint_last.pt"
            raise RunFilesError(f"exporting {path} failed: {exc.strerror or exc}; the run itself is saved in {last} "
                                f"(step {trainer.step}): fix that, then write the policy with: python -m flashlab "
                                f"export-tsp --checkpoint {last} --out {path}") from exc


def _say_if_out_of_time(trainer) -> None:
    """A resumed run whose time limit is spent trains nothing: say so rather than end silently."""
    limit = trainer.run.time_limit_min
    if limit and trainer.train_seconds >= 60 * limit and trainer.rank == 0:
        print(f"resume: the time limit is reached already ({trainer.train_seconds / 60:.1f} min trained, "
              f"--time-limit-min {limit:g}): no step runs; give a larger --time-limit-min to train on.", flush=True)


# ---------------------------------------------------------------- eval-tsp
# tours decoded at once by eval-tsp: a GPU wants large batches (at 100 cities, 32768 tours' node embeddings
# and decoder keys are 32768·100·4·128 floats, 6.7 GB in fp32); on a CPU larger batches gain little


def _eval_tsp_options(p) -> None:
    p.add_argument("--checkpoint", required=True, help="a tsp-model checkpoint (am_tspN.pt, as train-tsp exports)")
    p.add_argument("--nodes", type=_bounded(int, low=3), default=None,
                   help="cities per test instance (≥ 3; default: the checkpoint's, as it was trained)")
    p.add_argument("--instances", type=POSITIVE, default=10000, help="test instances (default 10000)")
    # Training draws step s's instances from seed·1,000,003 + s: this default is far from those.
    p.add_argument("--seed", type=_bounded(int, low=0, high=2**64 - 1), default=1_234_567_891,
                   help="test-set seed, 0 ≤ seed < 2^64 as torch.manual_seed takes it (default 1234567891)")
    p.add_argument("--save-tours", help="write the test seed, tours and lengths to this .npz file "
                                           "(flashlab.train.tsp.load_tours reads it): the greedy tours, or the "
                                           "shortest found with the options below")
    p.add_argument("--overwrite", action="store_true", help="replace --save-tours if it exists (refused otherwise)")
    p.add_argument("--attention", choices=["auto", "flashlab", "sdpa", "naive"], default="auto",
                   help="auto: flashlab on a GPU (compiled), SDPA on a CPU (the kernels would run in Triton's "
                        "interpreter: hours for 10,000 instances)")
    spend = p.add_argument_group("inference that spends compute for quality: many tours per instance, the shortest "
                                 "kept and reported beside greedy (flashlab.train.tsp.best_tours); they combine")
    spend.add_argument("--multi-start", action="store_true",
                       help="decode from every city as the first, n tours per instance (POMO's multi-start)")
    spend.add_argument("--augment", type=int, choices=[1, 8], default=1,
                       help="8: decode each instance's 8 symmetric views, its flips and the swap of x and y "
                            "(POMO's augmentation); default 1")
    spend.add_argument("--samples", type=NON_NEGATIVE, default=0, metavar="K",
                       help="K > 0: sample K tours (per start and view) instead of decoding greedily (Kool et al.: "
                            "1280); default 0")
    spend.add_argument("--temperature", type=_bounded(float, low=0, low_open=True), default=None, metavar="T",
                       help="softmax temperature of --samples, > 0 (default 1: the model's own probabilities)")
    spend.add_argument("--sampling-seed", type=_bounded(int, low=0, high=2**64 - 1), default=0, metavar="SEED",
                       help="seed of --samples' random numbers (default 0)")
    spend.add_argument("--max-rollouts", type=POSITIVE, default=None, metavar="R",
                       help=f"tours decoded at once, which bounds memory (default {EVAL_MAX_ROLLOUTS['cpu']} on a "
                            f"CPU, {EVAL_MAX_ROLLOUTS['cuda']} on a GPU)")


def _eval_tsp_inference(args) -> dict | None:
    """The options of `flashlab.train.tsp.best_tours` that eval-tsp's flags ask for (None: greedy
    alone), checked before any work."""
    for option, name in (("--temperature", "temperature"), ("--sampling-seed", "sampling_seed")):
        if name in args.given and not args.samples:
            raise UsageError(f"{option}: only sampled tours use it; give --samples K too (or leave {option} out).")
    if args.temperature is not None and not args.temperature < float("inf"):      # nan, inf
        raise UsageError(f"--temperature: {args.temperature} is not a finite number; give a positive number.")
    if not (args.multi_start or args.augment > 1 or args.samples):
        return None
    return {"augment": args.augment, "starts": args.nodes if args.multi_start else 0, "samples": args.samples,
            "temperature": 1.0 if args.temperature is None else args.temperature, "seed": args.sampling_seed}


def _eval_tsp(args) -> None:
    _existing_file("--checkpoint", args.checkpoint)
    _check_output_file("--save-tours", args.save_tours, overwrite=args.overwrite,
                       reading={"--checkpoint": args.checkpoint})

    from flashlab.train import memory
    from flashlab.train.model import ATTENTION
    from flashlab.train.trainer import default_attention
    from flashlab.train.tsp import (
        PUBLISHED,
        describe_inference,
        evaluate,
        gap_percent,
        load_model,
        save_tours,
        timed_best_tours,
    )

    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.attention if args.attention != "auto" else default_attention(device)
    model, metadata = load_model(args.checkpoint, device, attention_fn=ATTENTION[backend])
    trained_on = metadata.get("n_nodes") if isinstance(metadata, dict) else None
    if args.nodes is None:
        if not isinstance(trained_on, int):
            raise UsageError(f"--nodes: {args.checkpoint} does not say how many cities it was trained on; "
                             f"give --nodes N.")
        args.nodes = trained_on
    inference = _eval_tsp_inference(args)
    memory.check_tsp_evaluation_fits(args.nodes, args.instances, model.init_embed.out_features, torch.device(device),
                                     trained_on if isinstance(trained_on, int) else None, default_instances=10000)
    print(f"attention: {backend} on {device}")
    if isinstance(trained_on, int) and trained_on != args.nodes:
        print(f"  (trained on TSP{trained_on}, evaluated on TSP{args.nodes})")
    result = evaluate(model, args.nodes, args.instances, args.seed, device)
    mean = result["lengths"].mean().item()
    line = f"TSP{args.nodes}, {args.instances} instances (seed {args.seed}): greedy mean tour length {mean:.4f}"
    if args.nodes in PUBLISHED:
        optimal = PUBLISHED[args.nodes]["optimal"]
        line += f", gap to the published optimum {optimal}: {gap_percent(mean, args.nodes):.2f}%"
        line += f" (Kool et al. AM greedy: {PUBLISHED[args.nodes]['am_greedy']})"
    print(f"{line}; {1e3 * result['seconds'] / args.instances:.3g} ms per instance")
    if inference:
        max_rollouts = args.max_rollouts or EVAL_MAX_ROLLOUTS[device]
        tours, lengths, seconds = timed_best_tours(model, result["coords"], **inference, max_rollouts=max_rollouts)
        result["tours"], result["lengths"] = tours, lengths          # what --save-tours writes
        best = lengths.mean().item()
        gap = gap_percent(best, args.nodes)
        print(f"  {describe_inference(**inference)}: mean tour length "
              f"{best:.4f}" + (f", gap {gap:.2f}%" if gap is not None else "")
              + f"; {1e3 * seconds / args.instances:.3g} ms per instance")
    for name in ("nearest_neighbour", "farthest_insertion"):
        print(f"  {name.replace('_', ' ')}: {result[name].mean().item():.4f}")
    if metadata:
        print("  checkpoint:", ", ".join(f"{k}={v}" for k, v in metadata.items()))
    if args.save_tours:
        try:
            save_tours(args.save_tours, args.seed, result["tours"], result["lengths"])
        except OSError as exc:
            raise _write_failed("--save-tours", args.save_tours, exc) from exc
        print(f"  the test seed, tours and lengths written to {args.save_tours} (flashlab.train.tsp.load_tours "
              f"reads them, the cities drawn again from the seed)")


# ---------------------------------------------------------------- export-tsp
def _export_tsp_options(p) -> None:
    p.add_argument("--checkpoint", required=True,
                   help="a tsp-training-state checkpoint (OUT_DIR/checkpoint_last.pt or checkpoint_<step>.pt)")
    p.add_argument("--out", required=True, help="where to write the policy (am_tspN.pt, as eval-tsp loads it)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it exists (refused otherwise; never the --checkpoint read)")


def _export_tsp_command(args) -> None:
    _existing_file("--checkpoint", args.checkpoint)
    _check_output_file("--out", args.out, overwrite=args.overwrite, reading={"--checkpoint": args.checkpoint})
    from flashlab.train.tsp_train import export_policy

    try:
        trainer = export_policy(args.checkpoint, args.out)
    except OSError as exc:
        raise _write_failed("--out", args.out, exc) from exc
    print(f"{args.out}: the TSP{trainer.task_config.n_nodes} policy at step {trainer.step} "
          f"({trainer.train_seconds / 60:.2f} min of training); evaluate it with eval-tsp --checkpoint {args.out}")


# ---------------------------------------------------------------- the table of commands
@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_options: object          # (parser) -> None
    run: object                  # (args) -> None
    aliases: tuple = ()
    # which option a "checkpoint: …" error refers to
    checkpoint_option: str = "--resume"


COMMANDS = [
    Command("bench-softmax", "benchmark the fused softmax", _softmax_options, _bench_softmax),
    Command("bench", "benchmark attention: flashlab, naive, every SDPA backend, FlexAttention",
            _attention_bench_options, _bench_attention, aliases=("bench-attention",)),
    Command("train", "train the causal transformer on associative recall (flashlab.train.trainer), or with "
                     "--task documents on packed or padded documents (flashlab.train.documents)",
            _train_options, _train),
    Command("train-tsp", "train the TSP Attention Model (REINFORCE; flashlab.train.tsp_train)", _tsp_train_options,
            _train_tsp),
    Command("eval-tsp", "evaluate a TSP Attention Model checkpoint", _eval_tsp_options, _eval_tsp,
            checkpoint_option="--checkpoint"),
    Command("export-tsp", "write the policy of a TSP training-state checkpoint as am_tspN.pt (for a run that was "
                          "killed before it could export)", _export_tsp_options, _export_tsp_command,
            checkpoint_option="--checkpoint"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="python -m flashlab", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    parser.subcommands = commands.choices           # name or alias -> its parser
    # listed for --help and "invalid choice"; main() hands `tune` its arguments before this parser runs
    commands.add_parser("tune", help="tune the attention kernels for a list of shapes ahead of training "
                                     "(flashlab.api.pretune; python -m flashlab tune --help)", add_help=False)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, aliases=list(command.aliases), help=command.help,
                                  description=command.help, allow_abbrev=False)
        command.add_options(sub)
        sub.set_defaults(command_spec=command)
    return parser


def _one_line(command: Command, exc: Exception) -> str:
    """``--option: what is wrong; what to give`` for a configuration or checkpoint error."""
    if isinstance(exc, ConfigError):
        return f"{_flag(exc.field)}: {exc.reason}"
    if isinstance(exc, CheckpointError):
        return f"{command.checkpoint_option}: {str(exc).removeprefix('checkpoint: ')}"
    return str(exc)


TUNE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) not in (4, 5) or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not B,H,N,D or B,H,N,D,H_kv (positive integers), "
                                         "e.g. --shape 8,16,2048,64")
    return shape


def tune_main(argv=None) -> int:
    """``python -m flashlab tune``: pre-tune a list of shapes on this machine's GPU."""
    from flashlab.api import pretune
    from flashlab.launch import autotune

    parser = OneLineErrorParser(prog="python -m flashlab tune", description=(
        "Tune flashlab's attention kernels for these shapes now, so that training does not pay for "
        "it on its first steps. Decisions go to the autotuner's cache (FLASHLAB_AUTOTUNE_CACHE, "
        "default ~/.cache/flashlab/autotune.json) that every later process reads."))
    parser.add_argument("--shape", type=parse_shape, action="append", required=True,
                        help="B,H,N,D or B,H,N,D,H_kv (GQA); repeat for several shapes")
    parser.add_argument("--dtype", choices=sorted(TUNE_DTYPES), action="append",
                        help="repeat for several (default: bf16)")
    parser.add_argument("--causal", choices=["yes", "no", "both"], default="both")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward kernels (inference)")
    parser.add_argument("--json", metavar="PATH", help="also write the decisions made to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU: tuning times the compiled kernels (the CPU interpreter has nothing to tune)")
    causal = {"yes": (True,), "no": (False,), "both": (False, True)}[args.causal]
    dtypes = [TUNE_DTYPES[d] for d in (args.dtype or ["bf16"])]

    def say(shape, dtype, is_causal, seconds):
        print(f"{','.join(map(str, shape))} {str(dtype).removeprefix('torch.')} "
              f"{'causal' if is_causal else 'full'}: {seconds:.1f} s", flush=True)

    entries = pretune.pretune(args.shape, dtypes, causal, backward=not args.forward_only, on_shape=say)
    tuned = sum("ms" in e for e in entries)
    print(f"{tuned} decisions tuned, {len(entries) - tuned} found stored; cache: "
          f"{autotune.tuner.cache_path or '(memory only)'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(entries, f, indent=1)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["tune"]:          # pre-tune the kernels for a list of shapes: its own options
        return tune_main(argv[1:])
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:           # said by the command's parser, so the line names the command and its --help
        parser.subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    # the options given on the command line (not defaulted): resume adopts the checkpoint's for the rest
    names = {token.split("=")[0] for token in argv if token.startswith("--")}
    args.given = {name.removeprefix("--no-").removeprefix("--").replace("-", "_") for name in names}
    command = args.command_spec
    prog = f"{parser.prog} {args.command}"
    try:
        command.run(args)
    except (UsageError, ConfigError, CheckpointError) as exc:
        print(f"{prog}: error: {' '.join(_one_line(command, exc).split())}", file=sys.stderr)
        return 2
    except RunFilesError as exc:          # a full or read-only disk …: what failed, and what is safe
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:       # Ctrl-C or SIGTERM: a training run stops between steps, and says so
        from flashlab.train.trainer import StoppedAtOnce, TrainingInterrupted

        if isinstance(exc, (TrainingInterrupted, StoppedAtOnce)):
            if os.environ.get("RANK", "0") == "0":      # under torchrun every rank stops alike: one says so
                print(f"{prog}: {exc}", file=sys.stderr)
            return 128 + getattr(signal.Signals, exc.signal_name).value
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from flashlab.train.trainer import TrainingDiverged

        if isinstance(exc, TrainingDiverged):
            print(f"{prog}: stopped: {exc}", file=sys.stderr)
            return 1
        raise
    finally:
        run_dir.release_all()             # the --out-dir this command held, for a caller that goes on
    return 0

