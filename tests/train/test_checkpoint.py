"""Checkpoints you can trust (flashlab.train.checkpoint): tensors and plain data only, loaded with
weights_only=True at every entry point; atomic saves; corruption refused; every shipped
checkpoint loads; the right kind for each use."""

import hashlib
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from flashlab.cli import main
from flashlab.train import checkpoint
from flashlab.train.trainer import RecallConfig, RunConfig, Trainer
from flashlab.train.tsp import AttentionModel, load_model, save_model
from flashlab.train.tsp_train import TSPConfig, TSPTrainer

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"am_tsp20.pt": "tsp-model", "am_tsp50.pt": "tsp-model", "am_tsp100.pt": "tsp-model",
           "mqar_long.pt": "lm-model", "tsp50_training_state.pt": "tsp-training-state",
           "tsp100_training_state.pt": "tsp-training-state"}


class _RunsACommand:
    """Pickles to ``os.system(command)``: what a crafted checkpoint can do to a plain torch.load."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _malicious_files(tmp_path, kind="tsp-model"):
    """(marker file, {attack: path}) for three attacks that create the marker: a plain pickle
    that runs a command; a flashlab-format file of ``kind`` whose payload (with a valid
    checksum) does it; one whose outer dict does it."""
    marker = tmp_path / "pwned"
    command = f"touch {marker}"
    plain = tmp_path / "plain.pt"
    torch.save({"model": {}, "config": {}, "step": _RunsACommand(command)}, plain)
    inner = checkpoint._serialize({"config": {}, "state": {"model": _RunsACommand(command)}, "metadata": {}})
    wrapped = tmp_path / f"wrapped-{kind}.pt"
    torch.save({"format": checkpoint.FORMAT, "version": 1, "kind": kind, "sha256": hashlib.sha256(inner).hexdigest(),
                "payload": torch.frombuffer(bytearray(inner), dtype=torch.uint8)}, wrapped)
    outer = tmp_path / "outer.pt"
    torch.save({"format": checkpoint.FORMAT, "version": 1, "kind": kind, "sha256": "0",
                "payload": _RunsACommand(command)}, outer)
    return marker, {"plain": plain, "wrapped": wrapped, "outer": outer}


def test_the_malicious_file_would_run_its_command_with_a_plain_load(tmp_path):
    """The attack is real: unpickling the file without restrictions runs the command (so
    the tests below can fail). The file holds no tensors, so its data.pkl unpickles on its own."""
    marker, files = _malicious_files(tmp_path)
    with zipfile.ZipFile(files["plain"]) as archive:
        pickle.loads(archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl"))))
    assert marker.exists()


TINY_TSP = TSPConfig(n_nodes=5, d_model=16, n_heads=2, n_layers=1, ff_dim=16, epoch_steps=2, eval_instances=8,
                     attention="sdpa")
TINY_TSP_RUN = RunConfig(batch_size=4, steps=1, device="cpu", progress=False)
TINY_LM = RecallConfig(seq_len=16, num_pairs=2, vocab_size=16, d_model=16, n_heads=2, n_layers=1, attention="sdpa")


@pytest.mark.parametrize("attack", ["plain", "wrapped", "outer"])
def test_no_entry_point_runs_code_from_a_checkpoint(tmp_path, capsys, attack):
    def evil(kind):              # each entry point gets a file of the kind it accepts
        return str(_malicious_files(tmp_path, kind)[1][attack])

    marker = _malicious_files(tmp_path)[0]
    library = [lambda: checkpoint.load(evil("lm-model")), lambda: load_model(evil("tsp-model")),
               lambda: Trainer(TINY_LM, RunConfig(device="cpu", progress=False, resume=evil("lm-training-state"))),
               lambda: TSPTrainer(TINY_TSP, RunConfig(device="cpu", progress=False, batch_size=4,
                                                      resume=evil("tsp-training-state")))]
    for entry in library:
        with pytest.raises(ValueError) as error:
            entry()
        assert "could run code; refused" in str(error.value), str(error.value)
    commands = [["eval-tsp", "--checkpoint", evil("tsp-model"), "--instances", "2"],
                ["train", "--resume", evil("lm-training-state"), "--device", "cpu", "--no-progress", "--steps", "1"],
                ["train-tsp", "--resume", evil("tsp-training-state"), "--device", "cpu", "--no-progress", "--steps",
                 "1", "--n-nodes", "5", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--ff-dim", "16",
                 "--eval-instances", "8", "--batch-size", "4", "--attention", "sdpa"]]
    for argv in commands:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        option = "--checkpoint" if argv[0] == "eval-tsp" else "--resume"
        assert err[0].startswith(f"python -m flashlab {argv[0]}: error: {option}: ") and "refused" in err[0], err
    assert not marker.exists(), "a checkpoint ran a command"


def test_the_command_line_refuses_a_malicious_checkpoint_in_one_line(tmp_path):
    marker, files = _malicious_files(tmp_path)
    result = subprocess.run([sys.executable, "-m", "flashlab", "eval-tsp", "--checkpoint", str(files["plain"])],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2 and not marker.exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "holds objects other than tensors and plain data" in lines[0] and "posix.system" in lines[0], lines


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_checkpoint_loads_with_weights_only(name):
    path = ROOT / "checkpoints" / name
    raw = torch.load(path, weights_only=True, map_location="cpu")       # torch's own safe loader reads it
    assert raw["format"] == checkpoint.FORMAT and raw["kind"] == SHIPPED[name]
    saved = checkpoint.load(path, kind=SHIPPED[name])                   # and the checksum holds
    # the TSP50 training state carries its per-step history (4.8 MB of 16.5 at 23,549 steps, 3.3 of
    # 14.7 at 15,000: it grows with every step); 16 MiB is also the largest file the GPU machine sends back
    assert path.stat().st_size < 16 * 2**20
    if SHIPPED[name] == "tsp-model":
        model, metadata = load_model(path)
        assert isinstance(model, AttentionModel) and metadata["n_nodes"] in (20, 50, 100) and metadata["steps"] > 0
    elif SHIPPED[name] == "lm-model":
        task = RecallConfig(**{**saved.config["task"], "attention": "sdpa"})
        trainer = Trainer(task, RunConfig(device="cpu", progress=False, batch_size=1))
        trainer.model.load_state_dict(saved.state["model"])
    else:
        task = TSPConfig(**{**saved.config["task"], "attention": "sdpa"})
        # compile "off": the run replayed CUDA graphs (reduce-overhead), which a CPU refuses
        trainer = TSPTrainer(task, RunConfig(**{**saved.config["run"], "device": "cpu", "resume": str(path),
                                                "out_dir": None, "progress": False, "compile": "off"}))
        exported = ROOT / "checkpoints" / name.replace("_training_state", "").replace("tsp", "am_tsp", 1)
        policy, metadata = load_model(exported)                               # exported from this state
        assert trainer.step == metadata["steps"] == len(trainer.history) and trainer.baseline_updates > 0
        assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), trainer.model.state_dict().values()))
        assert "instances_per_s" in trainer.history[-1]


def test_corrupted_and_torn_files_are_refused(tmp_path):
    torch.manual_seed(0)
    model = AttentionModel(embed_dim=16, n_heads=2, n_layers=1, ff_dim=16)
    path = tmp_path / "am.pt"
    save_model(model, path, note="x")
    data = bytearray(path.read_bytes())
    flipped = tmp_path / "flipped.pt"
    middle = len(data) // 2                                  # inside the payload (the weights)
    data[middle] ^= 0x10
    flipped.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="corrupted|not a complete"):
        load_model(flipped)
    for size in (0, 100, len(data) // 2, len(data) - 10):
        torn = tmp_path / f"torn{size}.pt"
        torn.write_bytes(path.read_bytes()[:size])
        with pytest.raises(checkpoint.CheckpointError, match="not a complete checkpoint"):
            load_model(torn)
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        load_model(tmp_path / "missing.pt")


def test_a_file_that_is_no_checkpoint_is_not_called_unsafe(tmp_path, capsys):
    """A learner trial: ``eval-tsp --checkpoint README.md`` said the file "holds objects other
    than tensors … could run code". A file torch.save cannot have written is now called what
    it is; a pickle that would run code is still refused as one, zip archive or not."""
    words = ["".join(chr(97 + int(i)) for i in torch.randint(0, 26, (int(n),))) for n in torch.randint(1, 9, (40,))]
    text = tmp_path / "README.md"
    text.write_text("# " + " ".join(words) + "\n")
    noise = tmp_path / "noise.pt"                            # random bytes, not opening as a zip or a pickle does
    noise.write_bytes(bytes([0x41]) + bytes(torch.randint(0, 256, (500,), dtype=torch.uint8).tolist()))
    plain_pickle = tmp_path / "plain.pkl"                    # a pickle of plain data, but not torch.save's
    plain_pickle.write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=2))      # torch.save's protocol
    for path in (text, noise, plain_pickle):
        with pytest.raises(checkpoint.CheckpointError) as error:
            checkpoint.load(path)
        assert f"{path} is not a PyTorch checkpoint" in str(error.value), str(error.value)
        assert "could run code" not in str(error.value)
    assert main(["eval-tsp", "--checkpoint", str(text)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"python -m flashlab eval-tsp: error: --checkpoint: {text} is not a PyTorch checkpoint (not a "
                   f"torch.save zip archive: it starts with {text.read_bytes()[:16]!r}); give the path of a .pt file "
                   f"written by flashlab."], err
    marker = tmp_path / "pwned"
    bare = tmp_path / "bare.pkl"                              # a bare pickle (no zip) that runs a command
    bare.write_bytes(pickle.dumps({"step": _RunsACommand(f"touch {marker}")}, protocol=2))
    with pytest.raises(checkpoint.CheckpointError, match="could run code; refused"):
        checkpoint.load(bare)
    assert not marker.exists()


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    checkpoint.save(path, "lm-model", {"a": 1}, {"w": torch.ones(3)})
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint, "WRITE_CHUNK", 64)
    real_fsync = os.fsync

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        checkpoint.save(path, "lm-model", {"a": 2}, {"w": torch.zeros(1000)})
    monkeypatch.setattr(checkpoint.os, "fsync", real_fsync)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["state.pt"]     # no temporary left behind
    assert checkpoint.load(path).config == {"a": 1}


def _nesting(text: str) -> int:
    """How deep the parentheses of ``text`` nest (1: some, none inside another)."""
    depth = deepest = 0
    for c in text:
        depth += (c == "(") - (c == ")")
        deepest = max(deepest, depth)
    return deepest


def test_the_wrong_kind_of_checkpoint_says_what_it_is(tmp_path, capsys):
    state = ROOT / "checkpoints" / "tsp50_training_state.pt"
    assert main(["eval-tsp", "--checkpoint", str(state), "--instances", "2"]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint:" in err and "is a tsp-training-state checkpoint" in err and "needs a tsp-model" in err
    # a learner trial: the kinds' descriptions sat in parentheses inside parentheses; and the
    # way from a training state to what eval-tsp reads was not said
    assert _nesting(err) <= 1, err
    assert f"`python -m flashlab export-tsp --checkpoint {state} --out model.pt`, then evaluate model.pt." in err
    policy = ROOT / "checkpoints" / "am_tsp20.pt"
    assert main(["export-tsp", "--checkpoint", str(policy), "--out", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint_last.pt" in err and "evaluated as it is by eval-tsp" in err and _nesting(err) <= 1, err
    for found in checkpoint.KINDS:                       # every pair reads as one sentence
        path = tmp_path / f"{found}.pt"
        checkpoint.save(path, found, {}, {"w": torch.randn(3)})
        for wanted in set(checkpoint.KINDS) - {found}:
            with pytest.raises(checkpoint.CheckpointError) as error:
                checkpoint.load(path, kind=wanted)
            said = str(error.value).removeprefix(f"checkpoint: {path}")
            assert _nesting(said) == 0 and ". " not in said and said.endswith("."), said
            assert said.startswith(f" is a{'n' if found.startswith('lm') else ''} {found} checkpoint, "), said
    with pytest.raises(ValueError, match="^resume: .* is a tsp-model checkpoint"):
        TSPTrainer(TINY_TSP, RunConfig(device="cpu", progress=False, resume=str(ROOT / "checkpoints" / "am_tsp20.pt")))
    with pytest.raises(TypeError, match=r"config\['f'\]: a builtin_function_or_method cannot go into a checkpoint"):
        checkpoint.save(tmp_path / "x.pt", "lm-model", {"f": print}, {})
    legacy = tmp_path / "legacy.pt"
    torch.save({"model": {}, "config": {}}, legacy)
    with pytest.raises(checkpoint.CheckpointError, match="not a flashlab checkpoint"):
        checkpoint.load(legacy)


def test_a_flip_in_the_unhashed_kind_is_refused(tmp_path):
    """The kind is stored beside the hashed payload. Found by the random flips below (one run in
    many): a flip in its key ("kind" → "kine") loaded as a checkpoint of no kind. Every bit of the
    key and of the value is flipped here."""
    path = tmp_path / "c.pt"
    checkpoint.save(path, "lm-model", {"d_model": 16}, {"w": torch.zeros(2)})
    data = path.read_bytes()
    spots = [i for i in range(len(data) - 8) if data[i:i + 4] == b"kind" or data[i:i + 8] == b"lm-model"]
    assert spots, "the kind's key and value are in the archive's pickle"
    for start in spots:
        width = 4 if data[start:start + 4] == b"kind" else 8
        for position in range(start * 8, (start + width) * 8):
            damaged = bytearray(data)
            damaged[position // 8] ^= 1 << (position % 8)
            (tmp_path / "d.pt").write_bytes(bytes(damaged))
            with pytest.raises(checkpoint.CheckpointError):
                checkpoint.load(tmp_path / "d.pt")


def test_no_bit_flip_loads_as_different_data(tmp_path):
    """Flip one random bit, 60 times anywhere in a file: each copy is refused, or (a flip in
    the archive's padding) loads exactly the saved data, never different data."""
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 16), "step": 7}
    path = tmp_path / "c.pt"
    checkpoint.save(path, "lm-model", {"d_model": 16}, state)
    data = path.read_bytes()
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    refused = 0
    for position in torch.randint(0, len(data) * 8, (60,), generator=generator).tolist():
        damaged = bytearray(data)
        damaged[position // 8] ^= 1 << (position % 8)
        copy = tmp_path / "damaged.pt"
        copy.write_bytes(bytes(damaged))
        try:
            loaded = checkpoint.load(copy)
        except checkpoint.CheckpointError:
            refused += 1
            continue
        assert torch.equal(loaded.state["w"], state["w"]) and loaded.state["step"] == 7
        assert loaded.config == {"d_model": 16} and loaded.kind == "lm-model"
    assert refused >= 40                      # almost all of a file is checked bytes


def test_convert_legacy_converts_the_old_format_and_refuses_the_new_one(tmp_path):
    """A first-format file (a plain dict) converts; a file in this format already used to be wrapped a
    second time, which then failed to load as its kind (KeyError 'model'): now refused in one line."""
    old = tmp_path / "old.pt"
    torch.save({"config": {"embed_dim": 8}, "metadata": {"steps": 3}, "model": {"w": torch.ones(2)}}, old)
    new = tmp_path / "new.pt"
    checkpoint.convert_legacy(old, new, "tsp-model")
    loaded = checkpoint.load(new, kind="tsp-model")
    assert loaded.config == {"embed_dim": 8} and loaded.metadata == {"steps": 3}
    assert torch.equal(loaded.state["model"]["w"], torch.ones(2))
    with pytest.raises(checkpoint.CheckpointError, match="is in this format already"):
        checkpoint.convert_legacy(new, tmp_path / "twice.pt", "tsp-model")
    assert not (tmp_path / "twice.pt").exists()
