"""Recorded GPU results: found in the repository, None for a name never recorded, and one
clear line when there is no repository to read them from."""

import pytest

import flashlab.recorded as recorded


def test_a_committed_result_loads_with_its_label():
    record = recorded.load_recorded("attention")
    assert record["rows"] and "H200" in recorded.describe(record)
    assert recorded.load_recorded("no_such_measurement") is None


def test_without_the_repository_the_error_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(recorded, "RESULTS_DIR", tmp_path / "not_here")
    with pytest.raises(FileNotFoundError, match="pip install -e .*FLASHLAB_RESULTS_DIR"):
        recorded.load_recorded("attention")
