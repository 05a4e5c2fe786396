"""Recorded GPU results: read by suite name from the repository, None for a suite never recorded
there, and one clear line when there is no repository to read them from."""

import json
import shutil
from pathlib import Path

import pytest

import flashlab.bench.records as recorded

RESULTS = Path(__file__).parents[2] / "results"


def test_a_committed_record_loads_by_suite_name_with_its_label():
    record = recorded.load("attention")
    assert record["rows"] and "H200" in recorded.measured_on(record) and record["suite"] == "attention"
    assert record["environment"]["date"] not in recorded.measured_on(record)   # a lesson shows what, not when
    assert recorded.load("attention", gpu="h100") is None             # not recorded on that GPU
    assert recorded.load("no-such-suite") is None
    assert (recorded.folder("tsp-training") / "tsp50_metrics.csv.gz").is_file()


def test_without_the_repository_the_error_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(recorded, "RESULTS_DIR", tmp_path / "not_here")
    for read in (lambda: recorded.load("attention"), lambda: recorded.folder("tsp-training")):
        with pytest.raises(FileNotFoundError, match="pip install -e .*FLASHLAB_RESULTS_DIR") as error:
            read()
        assert "\n" not in str(error.value)
    monkeypatch.setattr(recorded, "RESULTS_DIR", RESULTS)
    with pytest.raises(FileNotFoundError, match="no-such-data does not exist"):
        recorded.folder("no-such-data")


def test_roofline_peaks_say_where_each_number_comes_from(monkeypatch, tmp_path):
    """Notebook 02's roofline: a measured peak from the roofline record when a run recorded one, the
    copy bandwidth of the decode-varlen record otherwise, and the datasheet's matmul rate, labelled as
    such, where no run measured it (a learner found '790 TFLOP/s, measured' with no record)."""
    (tmp_path / "h200").mkdir()
    monkeypatch.setattr(recorded, "RESULTS_DIR", tmp_path)
    peaks = recorded.roofline_peaks("h200")                            # nothing recorded: the datasheet
    assert peaks["flops"] == 989e12 and peaks["bytes_per_s"] == 4.8e12
    assert "datasheet" in peaks["flops_source"] and "datasheet" in peaks["bytes_source"]
    shutil.copy(RESULTS / "h200/decode-varlen.json", tmp_path / "h200")
    peaks = recorded.roofline_peaks("h200")
    assert 4.0e12 < peaks["bytes_per_s"] < 4.8e12 and "measured" in peaks["bytes_source"]
    assert "no measurement recorded" in peaks["flops_source"]
    environment = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "date": "2026-12-06"}
    (tmp_path / "h200" / "roofline.json").write_text(json.dumps(
        {"environment": environment, "bf16_matmul": {"tflops": 700.0}, "copy": {"tb_per_s": 4.2}}))
    peaks = recorded.roofline_peaks("h200")
    assert peaks["flops"] == 700e12 and peaks["bytes_per_s"] == 4.2e12
    assert "measured (NVIDIA H200" in peaks["flops_source"] and "measured" in peaks["bytes_source"]
