"""decode-table on a CPU: a reduced grid runs through the interpreter, every row carries its times,
bandwidth fraction and (contiguous) SDPA's backends and agreement with SDPA; paged rows their
overhead; the targets are computed from the rows; rows over the memory limit are skipped, named."""

from flashlab.bench.suite import Context
from flashlab.bench.suites import SUITES
from flashlab.bench.suites.decode_table import QUICK, table, targets


def test_a_reduced_grid_and_its_targets(tmp_path):
    suite = SUITES["decode-table"]
    assert suite.needs == "gpu, or quick"
    ctx = Context(suite, "cpu", True, 120, tmp_path / "decode-table.json", {"rows": []})
    grid = dict(QUICK, batches=(1,), caches=(40,), heads=((4, 2),))
    rows = table(ctx, grid, copy_GBps=1.0)
    assert [r["page_size"] for r in rows] == ["contiguous", 16]
    contiguous, paged = rows
    assert contiguous["flashlab_ms"]["eager"] > 0 and contiguous["flashlab_ms"]["graph"] is None   # no GPU
    assert contiguous["fraction_of_copy_eager"] == contiguous["kv_bytes"] / contiguous["flashlab_ms"]["eager"] / 1e6
    assert isinstance(contiguous["sdpa_ms"]["MATH"]["eager"], float) and contiguous["error_vs_sdpa"] < 1e-5
    assert "speedup_eager" in contiguous and "paging_overhead_eager" in paged
    names = [t["name"] for t in targets(rows, "eager")]
    assert any(n.startswith("batch 1: fraction") for n in names) and any(n.startswith("pages of 16") for n in names)
    assert (tmp_path / "decode-table.json").exists()                       # saved after each row
    over = table(ctx, dict(grid, max_kv_bytes=1024), copy_GBps=1.0)[-1]
    assert over["skipped"].startswith("K/V of") and 2 * over["kv_bytes"] > 1024
