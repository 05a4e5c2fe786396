"""The scripts that produced results/ are modules of the `measurements` package: they run with
``python -m measurements.<name>`` from the repository root, with no PYTHONPATH, and import
each other as a package does (no sys.path edits, nothing imported from results/)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_measurement_runs_as_a_module_without_pythonpath():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-m", "measurements.targets_table", "results/h200/attention.json"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("Targets on NVIDIA H200") and "| dtype | N |" in run.stdout


def test_no_measurement_edits_sys_path_or_imports_from_results():
    for path in sorted((ROOT / "measurements").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                raise AssertionError(f"{path.name} touches sys.path")
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "results":
                raise AssertionError(f"{path.name} imports from results/")
    assert not list((ROOT / "results").glob("*.py")) and not list((ROOT / "results").glob("*.sh"))


def test_python_layers_runs_on_the_cpu(tmp_path):
    """measurements.python_layers (flashlab's per-call Python, kernels removed) runs on a CPU and
    leaves the launches as they were."""
    import json

    from flashlab.launch import small as flash_small
    before = flash_small.kernel_for, flash_small.direct_launch
    from measurements import python_layers
    python_layers.main([str(tmp_path), "--calls", "20", "--label", "ci"])
    record = json.loads((tmp_path / "python_layers_ci.json").read_text())
    times = record["us_per_call"]
    assert set(times) >= {"attention_fwd_bwd", "thin_fwd_bwd", "empty_fwd_bwd", "layers_above_thin"}
    assert all(value > 0 for name, value in times.items() if name != "layers_above_thin")
    assert (flash_small.kernel_for, flash_small.direct_launch) == before


def test_rl4co_step_runs_on_the_cpu(tmp_path):
    """measurements.rl4co_step (RL4CO's REINFORCE step, SDPA against flashlab; for the GPU) runs
    its smoke size here: every variant trains, and the greedy-tour check is recorded."""
    import json

    import pytest
    pytest.importorskip("rl4co")
    from measurements import rl4co_step
    rl4co_step.main([str(tmp_path), "--smoke"])
    (row,) = json.loads((tmp_path / "rl4co_step.json").read_text())["rows"]
    assert "error" not in row, row
    assert set(row["steps_per_s"]) == set(rl4co_step.VARIANTS) and all(r > 0 for r in row["steps_per_s"].values())
    assert row["check"]["fp32"]["identical_tours"] == 1.0, row["check"]      # same weights, same tours in fp32
    assert 0 <= row["check"]["bf16"]["identical_tours"] <= 1
    for variant in rl4co_step.VARIANTS:                                # the profiled step of each
        profile = row["profile"][variant]
        assert profile["wall_ms"] > 0 and 0 < profile["busy_ms"] and profile["top"], profile


def test_mixed_precision_memory_runs_small(tmp_path):
    """measurements.mixed_precision_memory (notebook 08's memory breakdown) at a toy size: a
    larger vocabulary costs more, and bf16-mixed needs less than 32-true with it."""
    import json

    from measurements import mixed_precision_memory
    mixed_precision_memory.main([str(tmp_path), "--batch", "2", "--seq-len", "512", "--vocabs", "4096", "64"])
    rows = json.loads((tmp_path / "mixed_precision_memory.json").read_text())["rows"]
    peak = {(r["vocab_size"], r["precision"]): r["peak_bytes"] for r in rows}
    assert peak[(4096, "32-true")] > peak[(64, "32-true")] and peak[(4096, "bf16-mixed")] > peak[(64, "bf16-mixed")]
    assert peak[(4096, "bf16-mixed")] < peak[(4096, "32-true")]


def test_the_tree_fits_what_a_gpu_call_carries():
    """A GPU call (measurements/next_gpu_session.sh) carries the tracked files and the untracked
    ones git does not ignore, 64 MiB at most: one refused to start on 2026-12-05 when TSP100's
    files took the tree to 73.7 MB. Kept under 56 MiB, room for the carried wheels (.whl/, 3.7 MB)
    and a session's new results."""
    import shutil

    import pytest
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    sizes = {name: (ROOT / name).stat().st_size for name in listed if name and (ROOT / name).is_file()}
    total = sum(sizes.values())
    largest = ", ".join(f"{name} {size / 2**20:.1f} MiB"
                        for name, size in sorted(sizes.items(), key=lambda item: -item[1])[:3])
    assert total < 56 * 2**20, f"the tree is {total / 2**20:.1f} MiB (largest: {largest}); a GPU call carries 64 MiB"


def test_small_graphs_choices_and_encoder_tiles_run_on_the_cpu(tmp_path):
    """The GPU session's tiles phase (small_graphs --sections choices encoder_tiles) at its smoke
    size: the fastest launches are recorded, and the encoder step is timed with the defaults, with
    q, k, v as three views, with O laid out as before and with those launches, beside SDPA."""
    import json

    from measurements import small_graphs
    assert small_graphs.main([str(tmp_path), "--smoke", "--sections", "choices", "encoder_tiles"]) == 0
    sections = json.loads((tmp_path / "small_graphs.json").read_text())["sections"]
    assert set(sections["choices"]["best"]["N=4 D=16"]) == {"forward", "backward"}
    (row,) = sections["encoder_tiles"]["rows"]
    assert {"sdpa", "flashlab default launches", "flashlab, three views (not packed)",
            "flashlab, three views, O contiguous (before 2026-12-05)"} <= set(row["median_ms_per_step"])
    assert all(ms > 0 for ms in row["median_ms_per_step"].values())


def test_encoder_tiles_times_the_packed_form_without_choices(tmp_path):
    """If the GPU's budget ends before `choices` reached an N, the encoder step is still timed there,
    packed, as three views and as before, beside SDPA (only the 'fastest launches' variant needs choices)."""
    import json

    from measurements import small_graphs
    assert small_graphs.main([str(tmp_path), "--smoke", "--sections", "encoder_tiles"]) == 0
    section = json.loads((tmp_path / "small_graphs.json").read_text())["sections"]["encoder_tiles"]
    (row,) = section["rows"]
    assert row["fastest"] is None and "no 'fastest launches' variant" in section["skipped"][0]["why"]
    assert set(row["median_ms_per_step"]) == {"sdpa", "flashlab default launches", "flashlab, three views (not packed)",
                                              "flashlab, three views, O contiguous (before 2026-12-05)"}
