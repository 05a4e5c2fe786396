"""The benchmark harness: a tiny CPU run of every implementation, and its command line."""

import json

import pytest
import torch

from flashlab.__main__ import main
from flashlab.benchmarks.attention import benchmark_attention


def test_every_cpu_implementation_is_timed_in_every_mode():
    rows = benchmark_attention([16], head_dims=(16,), causal=(True,), dtypes=(torch.float32,), tokens=32, heads=1,
                               device="cpu")
    assert {r["impl"] for r in rows} == {"flashlab", "naive", "sdpa_math"}
    assert all("error" not in r for r in rows)
    assert {(r["impl"], r["mode"]) for r in rows} == {(i, m) for i in ("flashlab", "naive", "sdpa_math")
                                                      for m in ("fwd", "bwd", "fwd+bwd")}
    assert all(r["ms"] > 0 and r["tflops"] > 0 and r["B"] == 2 for r in rows)


def test_command_line_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--seq-lens", "16", "--head-dims", "16", "--masks", "full", "--dtypes", "float16",
                 "--tokens", "16", "--heads", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {"gpu", "torch", "triton", "date"} <= set(record["environment"])
    assert len(record["rows"]) == 9 and "flashlab" in capsys.readouterr().out


@pytest.mark.parametrize("impl", ["naive", "sdpa_math", "flashlab"])
def test_rows_name_their_shape(impl):
    rows = benchmark_attention([8], head_dims=(16,), causal=(False,), tokens=8, heads=2, device="cpu",
                               modes=("fwd",), impls=None)
    row = next(r for r in rows if r["impl"] == impl)
    assert (row["B"], row["H"], row["N"], row["D"], row["causal"]) == (1, 2, 8, 16, False)
