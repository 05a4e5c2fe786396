"""decode-table on a CPU: a reduced grid runs through the interpreter, every row carries its times,
bandwidth fraction and (contiguous) SDPA's backends and agreement with SDPA; paged rows their
overhead; the targets are computed from the rows; rows over the memory limit are skipped, named."""

import torch

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


def test_the_masking_cost_rows_and_the_unmasked_kernel_agree_on_valid_inputs(tmp_path):
    from flashlab.api.decode import decode_attention
    from flashlab.bench.suites.decode_table import masking_cost, shuffled_pages
    ctx = Context(SUITES["decode-table"], "cpu", True, 120, tmp_path / "decode-table.json", {})
    rows = masking_cost(ctx, dict(QUICK, masking=dict(batches=(1,), cache=40, heads=(4, 2))))
    assert [r["page_size"] for r in rows] == ["contiguous", 16]
    assert all(r["overhead"] > -1 and len(r["ms"]) == 4 for r in rows)
    q, k, v = torch.randn(2, 1, 4, 16), torch.randn(2, 40, 2, 16), torch.randn(2, 40, 2, 16)
    k_pool, v_pool, table = shuffled_pages(k, v, 16, torch.Generator().manual_seed(0))
    lengths = torch.tensor([40, 17], dtype=torch.int32)
    masked = decode_attention(q, k_pool, v_pool, lengths, block_table=table)
    assert torch.equal(masked, decode_attention(q, k_pool, v_pool, lengths, block_table=table,
                                                launch_options={"IN_BOUNDS": False}))


def test_the_generation_section_generates_the_same_tokens_on_both_caches(tmp_path):
    """flashlab's paged cache (flash_attn_with_kvcache) and SDPA's static cache with a mask generate the
    same greedy tokens from the same model (fp32 on a CPU), and each gets its tokens/s."""
    from flashlab.bench.suites.decode_table import generation
    ctx = Context(SUITES["decode-table"], "cpu", True, 120, tmp_path / "decode-table.json", {})
    row, = generation(ctx, dict(QUICK, generation=dict(QUICK["generation"], steps=5)))
    assert row["same_tokens"] and set(row["tokens_per_s"]) == {"flashlab eager", "sdpa eager"}
    assert row["speedup_eager"] > 0
