"""Where mixed precision's memory saving goes (notebook 08): the peak memory of one training step
of notebook 08's H200 model (4 layers, width 512, 8 heads, 4096 tokens, batch 8: the trainer's
step, `flashlab.train.trainer`), in ``32-true`` and ``bf16-mixed``, with its 8,192-word vocabulary and with a
256-word one. The difference between the two vocabularies is what the loss over the vocabulary
costs (its logits taken to fp32 as the trainer does, their log-softmax and their gradient); what
is left is the rest of the model.

    PYTHONPATH=. python -m measurements.mixed_precision_memory OUT_DIR [--vocabs 8192 256]

Measured on a CPU (`flashlab.measure_peak_memory`: the peak of live tensor bytes from PyTorch's
allocator events) of the trainer's own step (`Trainer.train_step`, the task MQAR as on the H200;
fewer key-value pairs with the small vocabulary, which changes no tensor's size) with SDPA
attention, after one step so that AdamW's state exists: the same tensors a GPU step allocates
(on the H200, with flashlab attention, `results/h200/train.json` recorded 7.66 GiB and 5.78 GiB
for the two modes). About a minute per step on two cores. Writes OUT_DIR/mixed_precision_memory.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from flashlab import measure_peak_memory
from flashlab.bench.records import environment
from flashlab.train.trainer import RecallConfig, RunConfig, Trainer


def step_peak(vocab: int, precision: str, batch: int, seq_len: int) -> int:
    """Peak bytes of one `flashlab.train.trainer.Trainer.train_step` (the second: AdamW's moments exist)."""
    task = RecallConfig(seq_len=seq_len, num_pairs=min(512, seq_len // 8, vocab // 4), vocab_size=vocab, d_model=512,
                        n_layers=4, n_heads=8, attention="sdpa")
    trainer = Trainer(task, RunConfig(batch_size=batch, steps=2, precision=precision, device="cpu", progress=False))
    trainer.train_step()
    return measure_peak_memory(trainer.train_step, "cpu").peak_bytes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--vocabs", type=int, nargs="+", default=[8192, 256])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args(argv)
    rows = []
    for vocab in args.vocabs:
        for precision in ("32-true", "bf16-mixed"):
            start = time.perf_counter()
            peak = step_peak(vocab, precision, args.batch, args.seq_len)
            rows.append({"vocab_size": vocab, "precision": precision, "peak_bytes": peak})
            print(f"vocabulary {vocab:>5}, {rows[-1]['precision']:>10}: peak {peak / 2**30:.2f} GiB "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    record = {"environment": {**environment(), "gpu": f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"},
              "model": {"n_layers": 4, "d_model": 512, "n_heads": 8, "seq_len": args.seq_len, "batch_size": args.batch,
                        "attention": "sdpa", "optimizer": "AdamW"},
              "how": __doc__, "rows": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "mixed_precision_memory.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
