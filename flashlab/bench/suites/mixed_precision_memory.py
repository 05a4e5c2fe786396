"""mixed-precision-memory: where mixed precision's memory saving goes (notebook 08): the peak memory of
one training step of notebook 08's model (the trainer's own step, `Trainer.train_step`, the task MQAR
as in the train suite) in 32-true and bf16-mixed, with its 8,192-word vocabulary and with a 256-word
one. The difference between the two vocabularies is what the loss over the vocabulary costs (its
logits taken to fp32 as the trainer does, their log-softmax and their gradient); what is left is the
rest of the model.

Measured on the host CPU (`flashlab.measure_peak_memory`: the peak of live tensor bytes from
PyTorch's allocator events) with SDPA attention, after one step so that AdamW's state exists: the
same tensors a GPU step allocates. About a minute per step on two cores."""

from __future__ import annotations

import platform

import torch

from flashlab.bench.suite import Context, Suite

VOCABS, BATCH, SEQ_LEN = (8192, 256), 8, 4096
QUICK = dict(vocabs=(4096, 64), batch=2, seq_len=512)


def step_peak(vocab: int, precision: str, batch: int, seq_len: int) -> int:
    """Peak bytes of one `flashlab.train.trainer.Trainer.train_step` (the second: AdamW's moments exist)."""
    from flashlab.lessons.memory import measure_peak_memory
    from flashlab.train.trainer import RecallConfig, RunConfig, Trainer
    task = RecallConfig(seq_len=seq_len, num_pairs=min(512, seq_len // 8, vocab // 4), vocab_size=vocab, d_model=512,
                        n_layers=4, n_heads=8, attention="sdpa")
    trainer = Trainer(task, RunConfig(batch_size=batch, steps=2, precision=precision, device="cpu", progress=False))
    trainer.train_step()
    return measure_peak_memory(trainer.train_step, "cpu").peak_bytes


def run(ctx: Context) -> None:
    from flashlab.launch.timing import Stopwatch
    size = QUICK if ctx.quick else dict(vocabs=VOCABS, batch=BATCH, seq_len=SEQ_LEN)
    ctx.record["environment"]["gpu"] = f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
    ctx.record.update(model={"n_layers": 4, "d_model": 512, "n_heads": 8, "seq_len": size["seq_len"],
                             "batch_size": size["batch"], "attention": "sdpa", "optimizer": "AdamW"},
                      how=__doc__, rows=[], skipped=[])
    for vocab in size["vocabs"]:
        for precision in ("32-true", "bf16-mixed"):
            if ctx.over():
                ctx.record["skipped"].append({"vocab_size": vocab, "precision": precision})
                continue
            watch = Stopwatch()
            peak = step_peak(vocab, precision, size["batch"], size["seq_len"])
            ctx.record["rows"].append({"vocab_size": vocab, "precision": precision, "peak_bytes": peak})
            ctx.save()
            ctx.log(f"vocabulary {vocab:>5}, {precision:>10}: peak {peak / 2**30:.2f} GiB ({watch.seconds():.0f} s)")


SUITE = Suite(
    name="mixed-precision-memory",
    summary="notebook 08: a training step's peak memory, 32-true vs bf16-mixed, on the host CPU",
    measures="peak live tensor bytes of one trainer step (after one, so AdamW's moments exist) in 32-true and "
             "bf16-mixed, with an 8192- and a 256-word vocabulary: the loss's share and the rest's",
    shapes=f"4 layers, width 512, 8 heads, {SEQ_LEN} tokens, batch {BATCH}, SDPA, fp32 master weights. --quick: "
           "512 tokens, batch 2, vocabularies 4096 and 64",
    budget_s=360, min_s=30, run=run, needs="any", on_cpu_record=True)
