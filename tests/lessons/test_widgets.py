"""The notebook widgets' drawing and reporting functions (no browser needed)."""

import matplotlib
import pytest

matplotlib.use("Agg")
import torch  # noqa: E402

from flashlab.lessons.widgets import block_size_report, draw_tile_step, record_tiles  # noqa: E402


def test_tile_steps_skip_causal_tiles_and_end_with_the_right_state():
    q, k, v = (torch.randn(n, 4, dtype=torch.float64) for n in (12, 16, 16))
    steps = record_tiles(q, k, v, block_m=4, block_n=4, is_causal=True)
    assert len(steps) == 1 + 2 + 3          # query block i visits key blocks 0..i
    last = steps[-1]
    keep = torch.ones(12, 16, dtype=torch.bool).tril()[8:12]
    scores = (q[8:12] @ k.T / 2).masked_fill(~keep, -torch.inf)
    assert torch.allclose(last["m"] + torch.log(last["l"]), torch.logsumexp(scores, -1))
    fig = draw_tile_step(steps, 3, 12, 16, 4, 4, is_causal=True)
    assert fig.axes[0].get_xlabel().startswith("key index")


def test_block_size_report_states_blocks_and_traffic():
    text = block_size_report(96, 64, 4096)
    assert "block_m (B_r) = 64, block_n (B_c) = 192" in text and "naive" in text


def test_block_size_report_says_which_moves_more_both_ways():
    """Tiled moves fewer bytes than naive for a usual M and d, and more when M is small and
    d large (tiny tiles: K and V re-read N/block_m times); the ratio printed is never below 1."""
    import re

    from flashlab.lessons.traffic import blocks_for_onchip_memory, naive_attention_traffic, tiled_forward_traffic

    normal = block_size_report(96, 64, 4096).splitlines()[-1]
    assert normal == ("HBM traffic of the forward, N = 4,096: tiled 65.02 MiB, naive 131.00 MiB "
                      "(naive moves 2.0x more than tiled)"), (
        f"the usual case (notebook 03's saved output) changed: {normal!r}")
    inverted = block_size_report(16, 256, 65536)
    assert "tiled 512.06 GiB, naive 32.19 GiB (tiled moves 15.9x MORE than naive)" in inverted, (
        f"M = 16 KiB, d = 256: tiled moves 15.9x more bytes than naive and should say so; got:\n{inverted}")
    assert "tiles are too small" in inverted and "block_m = 8 below about d/2 = 128" in inverted, inverted
    for _ in range(20):                       # random settings of notebook 03's sliders (seeded by conftest)
        onchip_kib = 16 + 4 * int(torch.randint(0, 54, ()))                  # 16 .. 228 KiB
        head_dim = 2 ** int(torch.randint(4, 9, ()))                          # 16 .. 256
        seq_len = 2 ** int(torch.randint(8, 17, ()))                          # 256 .. 65,536
        text = block_size_report(onchip_kib, head_dim, seq_len)
        block_m, block_n = blocks_for_onchip_memory(onchip_kib * 1024, head_dim)
        tiled = sum(tiled_forward_traffic(1, 1, seq_len, head_dim, block_m=block_m, block_n=block_n).values())
        naive = sum(s.total for s in naive_attention_traffic(1, 1, seq_len, head_dim))
        want = (f"(tiled moves {tiled / naive:.1f}x MORE than naive)" if tiled > naive
                else f"(naive moves {naive / tiled:.1f}x more than tiled)")
        assert want in text, (f"M = {onchip_kib} KiB, d = {head_dim}, N = {seq_len}: tiled {tiled:,} B, naive "
                              f"{naive:,} B, so expected {want!r} in:\n{text}")
        ratios = [float(r) for r in re.findall(r"(\d+\.\d)x", text)]
        assert all(r >= 1.0 for r in ratios), f"a ratio below 1 ({ratios}) reads inverted:\n{text}"


def test_decoder_trace_and_step_figure():
    from flashlab.lessons.widgets import draw_decoding_step
    from flashlab.train.model import ATTENTION
    from flashlab.train.tsp import AttentionModel, random_instances

    torch.manual_seed(0)
    model = AttentionModel(embed_dim=16, n_heads=2, n_layers=1, ff_dim=32, attention_fn=ATTENTION["sdpa"]).eval()
    coords = random_instances(3, 7, seed=1)
    trace = []
    with torch.no_grad():
        tours, log_p = model(coords, "greedy", trace=trace)
    probabilities = torch.stack(trace, 1)                          # (batch, steps, cities)
    assert probabilities.shape == (3, 7, 7)
    torch.testing.assert_close(probabilities.sum(-1), torch.ones(3, 7))
    chosen = probabilities.gather(2, tours[..., None]).squeeze(-1)
    torch.testing.assert_close(chosen.log().sum(1), log_p)        # the tour's log-probability
    assert torch.equal(probabilities.argmax(-1), tours)            # greedy picks the most probable
    for step in range(1, 7):                                       # visited cities get probability 0
        assert (probabilities[:, step].gather(1, tours[:, :step]) == 0).all()
    fig = draw_decoding_step(coords[0], tours[0], probabilities[0], step=3)
    assert fig.axes[0].get_title() == "step 4 of 7"
    for step in (0, 1, 2, 6):        # every legend entry points at something drawn: no one-point "tour so far"
        fig = draw_decoding_step(coords[0], tours[0], probabilities[0], step=step)
        lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        want = (["chosen next"] + (["first city", "current city"] if step else [])
                + (["tour so far"] if step > 1 else []))
        assert sorted(labels) == sorted(want), (step, labels)
        if step > 1:
            assert len(lines["tour so far"].get_xdata()) == step


def test_decoder_slider_counts_steps_as_the_figure_title_does(monkeypatch):
    pytest.importorskip("ipywidgets")                  # the course installs it; a bare GPU machine may not
    import matplotlib.pyplot as plt

    import flashlab.lessons.widgets as lesson_widgets
    from flashlab.lessons.widgets import decoder_stepper_widget

    monkeypatch.setattr(lesson_widgets, "_in_jupyter", lambda: True)   # as in a notebook's kernel
    from flashlab.train.model import ATTENTION
    from flashlab.train.tsp import AttentionModel, random_instances

    torch.manual_seed(0)
    model = AttentionModel(embed_dim=16, n_heads=2, n_layers=1, ff_dim=32, attention_fn=ATTENTION["sdpa"])
    widget = decoder_stepper_widget(model, random_instances(1, 7, seed=1)[0])
    slider = widget.children[0]
    assert (slider.min, slider.max, slider.value) == (1, 7, 1)
    for step in (1, 7):
        plt.close("all")
        widget.f(step)                                             # what moving the slider to `step` calls
        assert plt.gcf().axes[0].get_title() == f"step {step} of 7"


@pytest.mark.parametrize("name, args, instead", [
    ("tile_stepper_widget", (), "draw_tile_step("),
    ("block_size_calculator_widget", (), "block_size_report("),
    ("number_formats_widget", (), "number_formats_report("),
    ("decoder_stepper_widget", (None, None), "draw_decoding_step("),
])
def test_a_widget_outside_jupyter_says_what_to_do_in_one_line(capsys, name, args, instead):
    """A learner trial ran tile_stepper_widget() in a terminal: two escape codes, nothing drawn."""
    import flashlab.lessons.widgets as lesson_widgets

    assert getattr(lesson_widgets, name)(*args) is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "\x1b" not in out, repr(out)
    assert f"{name}()" in out and "JupyterLab (make lab)" in out and instead in out
