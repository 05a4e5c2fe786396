"""The trainer's step benchmark: median step time, peak memory, tokens/s and MFU of one
training configuration (the records notebooks 08 and 09 read)."""

from __future__ import annotations

import dataclasses

import torch

from flashlab.train.trainer import RecallConfig, RunConfig, Trainer


def measure_step(task: RecallConfig, run: RunConfig, steps: int = 5, warmup: int = 2) -> dict:
    """Median step time and peak memory of ``task``/``run`` (GPU: peak allocated bytes)."""
    trainer = Trainer(task, dataclasses.replace(run, progress=False, out_dir=None, resume=None,
                                                steps=max(run.steps, steps + warmup)))
    if trainer.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(trainer.device)
    times = []
    for i in range(warmup + steps):
        m = trainer.train_step()
        if i >= warmup:
            times.append(m["step_ms"])
    times.sort()
    peak = torch.cuda.max_memory_allocated(trainer.device) if trainer.device.type == "cuda" else None
    return {"step_ms": times[len(times) // 2], "peak_bytes": peak, "loss": m["loss"],
            "parameters": trainer.model.num_parameters(),
            "tokens_per_s": trainer.work_per_step() / (times[len(times) // 2] / 1e3), "mfu": m["mfu"]}
