"""Recorded GPU results: found in the repository, None for a name never recorded, and one
clear line when there is no repository to read them from."""

from pathlib import Path

import pytest

import flashlab.bench.records as recorded


def test_a_committed_result_loads_with_its_label():
    record = recorded.load_recorded("attention")
    assert record["rows"] and "H200" in recorded.describe(record)
    assert recorded.load_recorded("no_such_measurement") is None


def test_without_the_repository_the_error_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(recorded, "RESULTS_DIR", tmp_path / "not_here")
    with pytest.raises(FileNotFoundError, match="pip install -e .*FLASHLAB_RESULTS_DIR"):
        recorded.load_recorded("attention")


def test_roofline_peaks_say_where_each_number_comes_from(monkeypatch, tmp_path):
    """Notebook 02's roofline: a measured peak from roofline_peaks.json when a run recorded one, the
    copy bandwidth of decode_varlen.json otherwise, and the datasheet's matmul rate, labelled as
    such, where no run measured it (a learner found '790 TFLOP/s, measured' with no record)."""
    import json
    import shutil

    (tmp_path / "h200").mkdir()
    monkeypatch.setattr(recorded, "RESULTS_DIR", tmp_path)
    peaks = recorded.roofline_peaks("h200")                            # nothing recorded: the datasheet
    assert peaks["flops"] == 989e12 and peaks["bytes_per_s"] == 4.8e12
    assert "datasheet" in peaks["flops_source"] and "datasheet" in peaks["bytes_source"]
    shutil.copy(Path(__file__).parents[2] / "results/h200/decode_varlen.json", tmp_path / "h200")
    peaks = recorded.roofline_peaks("h200")
    assert 4.0e12 < peaks["bytes_per_s"] < 4.8e12 and "measured" in peaks["bytes_source"]
    assert "no measurement recorded" in peaks["flops_source"]
    environment = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "date": "2026-12-06"}
    (tmp_path / "h200" / "roofline_peaks.json").write_text(json.dumps(
        {"environment": environment, "bf16_matmul": {"tflops": 700.0}, "copy": {"tb_per_s": 4.2}}))
    peaks = recorded.roofline_peaks("h200")
    assert peaks["flops"] == 700e12 and peaks["bytes_per_s"] == 4.2e12
    assert "measured (NVIDIA H200" in peaks["flops_source"] and "measured" in peaks["bytes_source"]
