"""The benchmark harness: a tiny CPU run of every implementation, and its command line."""

import json

import pytest
import torch

from flashlab.bench.attention import benchmark_attention
from flashlab.cli import main


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
    impls = {r["impl"] for r in record["rows"]}          # a GPU adds SDPA's other backends and FlexAttention
    assert {"flashlab", "naive", "sdpa_math"} <= impls and len(record["rows"]) == 3 * len(impls)   # 3 modes each
    assert "flashlab" in capsys.readouterr().out


@pytest.mark.parametrize("impl", ["naive", "sdpa_math", "flashlab"])
def test_rows_name_their_shape(impl):
    rows = benchmark_attention([8], head_dims=(16,), causal=(False,), tokens=8, heads=2, device="cpu",
                               modes=("fwd",), impls=None)
    row = next(r for r in rows if r["impl"] == impl)
    assert (row["B"], row["H"], row["N"], row["D"], row["causal"]) == (1, 2, 8, 16, False)


def test_cpu_timing_runs_on_one_thread_and_gives_the_threads_back():
    """A CPU run times on one intra-op thread (two threads on a shared two-core machine stalled
    naive attention at N = 64 from 0.13 ms to 32 ms), and leaves the thread count as it was."""
    seen = []

    def spy(q, k, v, is_causal):
        seen.append(torch.get_num_threads())
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rows = benchmark_attention([8], head_dims=(16,), causal=(False,), dtypes=(torch.float32,), tokens=8, heads=1,
                                   device="cpu", modes=("fwd",), impls={"spy": spy})
        assert rows[0]["ms"] > 0 and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_softmax_benchmark_progress_bar_can_be_turned_off(capsys):
    """Notebook 02's live run turns the progress bar off: its saved output would show it at 0%."""
    from flashlab.bench.softmax import benchmark_softmax

    rows = benchmark_softmax(2, [8], torch.float32, device="cpu", progress=False)
    assert {r["impl"] for r in rows} == {"flashlab fused (Triton)", "torch.softmax", "unfused PyTorch ops"}
    assert "softmax benchmark" not in capsys.readouterr().err
