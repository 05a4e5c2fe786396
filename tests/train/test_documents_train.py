"""Training on documents of random lengths (`flashlab.train.documents`, ``python -m flashlab
train --task documents``): packed and padded batches of the same documents give the same
loss at initialization, a short run learns, real tokens (never padding) are counted, resume
continues exactly, and the command line route works end to end."""

import dataclasses

import pytest
import torch

from flashlab.cli import main
from flashlab.train.documents import DocumentsConfig, DocumentsTrainer
from flashlab.train.trainer import RecallConfig, RunConfig, read_metrics

TINY = dict(max_len=24, vocab_size=16, d_model=32, n_layers=1, n_heads=2)
RUN = dict(device="cpu", batch_size=8, lr=1e-2, warmup_steps=2, progress=False)


def _trainer(packing, attention="sdpa", steps=1, **run):
    return DocumentsTrainer(DocumentsConfig(packing=packing, attention=attention, **TINY),
                            RunConfig(steps=steps, **{**RUN, **run}))


@pytest.mark.parametrize("attention", ["sdpa", "flashlab"])
def test_packed_and_padded_give_the_same_loss_at_initialization(attention):
    """Same seed → same weights and same documents; the mean loss over real next-token targets
    (and the number of correct predictions) must not depend on the layout. flashlab: the packed
    batch goes through varlen_attention's kernels, the padded one through attention()'s."""
    packed, padded = _trainer("packed", attention), _trainer("padded", attention)
    for name, p in packed.model.state_dict().items():
        assert torch.equal(p, padded.model.state_dict()[name]), name
    inputs, targets = packed.batch(0, 0)
    assert isinstance(inputs, tuple) and inputs[0].dim() == 1                  # packed: (total,)
    loss_packed, correct_packed, count_packed = packed.compute_loss(inputs, targets)
    loss_padded, correct_padded, count_padded = padded.compute_loss(*padded.batch(0, 0))
    assert count_packed == count_padded > 0 and correct_packed == correct_padded
    assert abs(loss_packed.item() - loss_padded.item()) <= 1e-5 * loss_padded.item()
    assert packed.work_per_step() == padded.work_per_step() == sum(len(d) for d in packed.global_batch(0))


def test_token_counts_leave_out_padding():
    trainer = _trainer("padded")
    documents = trainer.global_batch(0)
    assert trainer.token_slots(0) == len(documents) * max(len(d) for d in documents)
    assert trainer.work_per_step() == sum(len(d) for d in documents) < trainer.token_slots(0)
    assert _trainer("packed").token_slots(0) == sum(len(d) for d in documents)


@pytest.mark.parametrize("packing", ["packed", "padded"])
def test_a_short_run_learns_and_logs_real_tokens(packing, tmp_path):
    """Patterns of 2 tokens from 8, documents of 12 tokens on average: learnable in 40 steps
    (measured: the mean loss of the last 5 steps is about 1/4 of the first 5's)."""
    trainer = DocumentsTrainer(DocumentsConfig(packing=packing, attention="sdpa", **{**TINY, "vocab_size": 8},
                                               max_period=2, mean_fraction=0.5),
                               RunConfig(steps=40, **{**RUN, "batch_size": 16}, out_dir=str(tmp_path)))
    history = trainer.fit()
    first, last = sum(h["loss"] for h in history[:5]) / 5, sum(h["loss"] for h in history[-5:]) / 5
    assert last < 0.5 * first, (first, last)
    rows = read_metrics(tmp_path / "metrics.csv")
    assert len(rows) == 40 and all(r["tokens_per_s"] > 0 for r in rows)
    assert all(r["real_tokens"] == sum(len(d) for d in trainer.global_batch(int(r["step"]))) for r in rows[-2:])
    assert all((r["token_slots"] == r["real_tokens"]) == (packing == "packed") for r in rows)


@pytest.mark.parametrize("packing", ["packed", "padded"])
def test_a_batch_without_targets_updates_nothing(packing, monkeypatch):
    """Found by a user trial: a batch of one-token documents (no next-token target) logged loss 0
    and stepped AdamW (momentum and weight decay still move the weights). Now: no update, loss NaN,
    counted as skipped but not as a run of bad steps."""
    trainer = _trainer(packing, steps=1)
    monkeypatch.setattr(trainer, "micro_documents", lambda step, micro, rank=None: [torch.tensor([3])] * 4)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    metrics = trainer.train_step()
    assert metrics["loss"] != metrics["loss"] and metrics["skipped"] == 1          # NaN
    assert trainer.skipped_steps == 1 and trainer.bad_in_a_row == 0
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_resume_continues_exactly(tmp_path):
    """Two steps, a checkpoint, two more, equal an uninterrupted run of four (weights, losses);
    a checkpoint of another task or model is refused."""
    whole = _trainer("packed", steps=4)
    whole.fit()
    first = _trainer("packed", steps=2, out_dir=str(tmp_path))
    first.fit()
    resumed = _trainer("packed", steps=4, resume=str(tmp_path / "checkpoint_last.pt"))
    resumed.fit()
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    for name, p in whole.model.state_dict().items():
        assert torch.equal(p, resumed.model.state_dict()[name]), name
    with pytest.raises(ValueError, match="d_model is 16 but the checkpoint has 32"):
        DocumentsTrainer(DocumentsConfig(**{**TINY, "d_model": 16}),
                         RunConfig(**RUN, resume=str(tmp_path / "checkpoint_last.pt")))


def test_shared_model_options_mean_the_same_in_both_tasks():
    """The command line gives both tasks one option per shared field: same default, range,
    choices and resume rule."""
    recall = {f.name: f for f in dataclasses.fields(RecallConfig)}
    shared = [f for f in dataclasses.fields(DocumentsConfig) if f.name in recall]
    assert {f.name for f in shared} >= {"vocab_size", "d_model", "n_layers", "n_heads", "attention", "dropout"}
    for f in shared:
        assert f.default == recall[f.name].default, f.name
        assert {k: v for k, v in f.metadata.items() if k != "help"} == \
            {k: v for k, v in recall[f.name].metadata.items() if k != "help"}, f.name


def test_command_line_trains_and_resumes_packed_and_padded(tmp_path, capsys):
    tiny = ["--max-len", "24", "--vocab-size", "16", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
            "--batch-size", "8", "--device", "cpu", "--attention", "sdpa", "--no-progress"]
    for packing in ("packed", "padded"):
        out = str(tmp_path / packing)
        assert main(["train", "--task", "documents", "--packing", packing, "--steps", "2", "--out-dir", out,
                     *tiny]) == 0
        assert f"steps 2, skipped 0, {packing}" in capsys.readouterr().out
        # resume without --task or the model flags: both come from the checkpoint
        assert main(["train", "--resume", f"{out}/checkpoint_last.pt", "--steps", "3", "--out-dir", out,
                     "--device", "cpu", "--no-progress"]) == 0
        assert "steps 3, skipped 0" in capsys.readouterr().out
        assert len(read_metrics(f"{out}/metrics.csv")) == 3


def test_compiling_packed_batches_is_refused_in_one_line(tmp_path, capsys):
    """packed_forward calls the layers around varlen_attention, which torch.compile cannot trace: a
    --compile that would compile nothing, silently, is refused; padded batches compile."""
    tiny = ["--max-len", "24", "--vocab-size", "16", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
            "--batch-size", "8", "--device", "cpu", "--attention", "sdpa", "--no-progress", "--steps", "1"]
    assert main(["train", "--task", "documents", "--packing", "packed", "--compile", "default",
                 "--out-dir", str(tmp_path / "packed"), *tiny]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compile" in err and "--packing padded" in err, err
