"""`python -m flashlab.bench`: the suites are listed by name, an unknown name or a bad option is
refused in one line, a GPU suite on a machine without one is skipped in one line, and a --quick
run writes the record (with its environment and command), the log and the tarball."""

import ast
import json
import tarfile
from pathlib import Path

import pytest
import torch

from flashlab.bench.__main__ import main
from flashlab.bench.suite import Suite, device_slug
from flashlab.bench.suites import SUITES

SUITES_DIR = Path(__file__).parents[2] / "flashlab" / "bench" / "suites"
NEEDED = {"attention", "softmax", "roofline", "small-table", "decode-varlen", "train", "tsp-encoder", "hopper-ladder",
          "kernel-resources", "claims", "gpu-tests"}


def test_list_and_help_name_every_suite(capsys):
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert NEEDED <= set(SUITES)
    for suite in SUITES.values():
        assert f"{suite.name}: {suite.summary}" in listing and f"{suite.record}.json" in listing
        assert suite.measures and suite.shapes and suite.budget_s >= suite.min_s > 0
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert all(name in text for name in SUITES)


@pytest.mark.parametrize("argv, message", [
    (["run", "atention", "--out", "OUT", "--budget-s", "60"], "unknown suite 'atention'; choose from attention, "),
    (["run", "softmax", "--out", "OUT", "--budget-s", "-5"], "--budget-s -5: give a positive number of seconds"),
    (["run", "softmax", "--budget-s", "60"], "the following arguments are required: --out"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_a_bad_command_is_refused_in_one_line(capsys, tmp_path, argv, message):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    try:
        status = main(argv)
    except SystemExit as done:
        status = done.code
    err = capsys.readouterr().err
    assert status == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_gpu_suites_are_skipped_on_a_cpu_in_one_line(capsys, tmp_path):
    assert main(["run", "roofline", "small-table", "--out", str(tmp_path), "--budget-s", "60"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "roofline: needs a CUDA GPU; skipped" in lines
    assert "small-table: needs a CUDA GPU (on a CPU only its --quick shapes run); skipped" in lines
    assert not list(tmp_path.glob("*/*.json"))
    assert (tmp_path / "run.log").read_text().count("skipped") == 2
    assert tarfile.open(tmp_path / "records.tar.gz").getnames() == ["run.log"]


def test_a_suite_that_would_not_fit_the_budget_is_skipped_and_says_so(capsys, tmp_path):
    suite = SUITES["python-layers"]
    assert main(["run", "python-layers", "--out", str(tmp_path), "--budget-s", str(suite.min_s / 2)]) == 0
    out = capsys.readouterr().out
    assert f"python-layers: skipped, it needs at least {suite.min_s:.0f} s" in out
    assert not list(tmp_path.glob("*/*.json"))


def test_a_quick_run_writes_the_record_the_log_and_the_tarball(capsys, tmp_path):
    """python-layers runs on a CPU (every launch a no-op): its record carries the environment and the
    exact command, its log the suite's output, and records.tar.gz both, filed as results/ files them."""
    argv = ["run", "python-layers", "--out", str(tmp_path), "--budget-s", "120", "--quick"]
    assert main(argv) == 0
    gpu = device_slug(torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    record = json.loads((tmp_path / gpu / "python-layers.json").read_text())
    assert record["suite"] == "python-layers" and record["quick"] is True
    assert record["command"] == "python -m flashlab.bench " + " ".join(argv)
    assert {"gpu", "torch", "triton", "date"} <= set(record["environment"])
    assert record["us_per_call"]["attention_fwd_bwd"] > 0 and record["seconds"] < 120
    assert "attention_fwd_bwd" in (tmp_path / gpu / "python-layers.log").read_text()
    with tarfile.open(tmp_path / "records.tar.gz") as tar:
        assert sorted(tar.getnames()) == sorted([f"{gpu}/python-layers.json", f"{gpu}/python-layers.log", "run.log"])
        assert json.load(tar.extractfile(f"{gpu}/python-layers.json")) == record
    assert "python-layers: done" in capsys.readouterr().out


@pytest.mark.parametrize("name, slug", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA A100-SXM4-80GB", "a100"), (None, "cpu"),
                                        ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090")])
def test_device_slugs(name, slug):
    assert device_slug(name) == slug


def test_a_suite_states_what_it_needs():
    def run(ctx):
        return None

    gpu = Suite("g", "s", "m", "x", 10, run)
    quick = Suite("q", "s", "m", "x", 10, run, needs="gpu, or quick")
    missing = Suite("r", "s", "m", "x", 10, run, needs="any", requires=("no_such_package_here",))
    assert gpu.refusal(has_gpu=True, quick=False) is None and gpu.refusal(False, True) == "g: needs a CUDA GPU; skipped"
    assert quick.refusal(False, True) is None and "only its --quick shapes" in quick.refusal(False, False)
    assert missing.refusal(True, False) == ("r: needs the Python package no_such_package_here, not installed here; "
                                            "skipped")
    with pytest.raises(ValueError, match="needs='cpu'; choose one of"):
        Suite("bad", "s", "m", "x", 10, run, needs="cpu")


def test_no_suite_keeps_its_own_clock():
    """Every time a suite reports goes through flashlab.launch.timing (time_ms, time_graph_ms, wall_ms,
    Stopwatch): no suite reads a clock itself."""
    clocks = {"perf_counter", "time", "monotonic", "process_time", "Event", "do_bench"}
    for path in sorted(SUITES_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in clocks and isinstance(node.value, (ast.Name,
                                                                                                  ast.Attribute)):
                owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
                assert owner not in ("time", "cuda", "testing"), f"{path.name} reads {owner}.{node.attr}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "time" not in names, f"{path.name} imports time"


def test_tar_only_leaves_the_tarball_alone(tmp_path):
    """--tar-only: a device call returns at most 8 files, so the output folder keeps one."""
    from flashlab.bench.runner import _pack
    (tmp_path / "h200" / "mqar-training").mkdir(parents=True)
    files = [tmp_path / "h200" / "a.json", tmp_path / "h200" / "a.log", tmp_path / "h200" / "mqar-training" / "m.csv",
             tmp_path / "run.log"]
    for path in files:
        path.write_text(path.name)
    _pack(tmp_path, [*files[:2], files[2].parent, files[3]], tar_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.tar.gz"]
    with tarfile.open(tmp_path / "records.tar.gz") as tar:
        assert set(tar.getnames()) >= {"h200/a.json", "h200/a.log", "h200/mqar-training/m.csv", "run.log"}
