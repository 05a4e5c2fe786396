"""Interactive figures for the notebooks: step through the tiles of a tiled attention
forward, size blocks for a given on-chip memory, see how numbers round in each format, and
step through the TSP Attention Model's decoder.

The drawing functions return matplotlib figures and work without a notebook (tests call
them); the ``*_widget`` functions wrap them in ipywidgets sliders. A slider needs a running
Jupyter kernel: called anywhere else, a ``*_widget`` function prints one line naming the drawing
or report function to call instead, and returns None.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from flashlab.reference.tiled import tiled_attention_forward

from .instrument import TileRecorder
from .memory import dtype_bytes, format_bytes
from .traffic import blocks_for_onchip_memory, naive_attention_traffic, tiled_forward_traffic


def _in_jupyter() -> bool:
    """Whether a Jupyter kernel runs this code: only there can a slider be drawn and moved."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _outside_jupyter(widget: str, instead: str) -> bool:
    """True, after printing one line that says what to do, when no Jupyter kernel runs this code:
    there ipywidgets would draw nothing and print its output area's terminal escape codes."""
    if _in_jupyter():
        return False
    print(f"{widget}() is a slider for Jupyter: open the notebook in JupyterLab (make lab) to use it; "
          f"in a script or terminal, call {instead} instead.")
    return True


def record_tiles(q, k, v, block_m, block_n, is_causal=False) -> list[dict]:
    """Run the tiled forward on one head (q, k, v of shape (N, D)) and return the state
    after every tile step: q_start, k_start, running max m, running sum l, accumulator."""
    recorder = TileRecorder()
    tiled_attention_forward(q, k, v, is_causal, None, block_m, block_n, observer=recorder)
    return recorder.steps


def draw_tile_step(steps, step, n_queries, n_keys, block_m, block_n, is_causal=False, rows=3):
    """Figure for one step: which tiles of the (virtual) score matrix are done, on chip or
    skipped, and the running softmax state of the first ``rows`` rows of the query tile."""
    state = steps[step]
    fig, (grid, table) = plt.subplots(1, 2, figsize=(10, 4.4), gridspec_kw={"width_ratios": [1.1, 1]})
    for q0 in range(0, n_queries, block_m):
        for k0 in range(0, n_keys, block_n):
            h, w = min(block_m, n_queries - q0), min(block_n, n_keys - k0)
            visited = any(s["q_start"] == q0 and s["k_start"] == k0 for s in steps[:step + 1])
            skipped = is_causal and k0 > min(q0 + block_m, n_queries) - 1
            current = (q0, k0) == (state["q_start"], state["k_start"])
            color = "tab:orange" if current else "0.6" if visited else "white" if skipped else "0.92"
            grid.add_patch(Rectangle((k0, q0), w, h, facecolor=color, edgecolor="k", lw=0.8,
                                     hatch="//" if skipped else None))
    grid.set(xlim=(0, n_keys), ylim=(n_queries, 0), xlabel="key index j  (K/V tiles)",
             ylabel="query index i  (Q tiles)",
             title=f"step {step + 1}/{len(steps)}: queries {state['q_start']}–"
                   f"{min(state['q_start'] + block_m, n_queries) - 1} × keys {state['k_start']}–"
                   f"{min(state['k_start'] + block_n, n_keys) - 1}")
    grid.set_aspect("equal")
    grid.legend(handles=[Rectangle((0, 0), 1, 1, fc=c, ec="k", hatch=h) for c, h in
                         (("tab:orange", None), ("0.6", None), ("0.92", None), ("white", "//"))],
                labels=["on chip now", "done", "to do", "skipped (causal)"], fontsize=7,
                loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4)   # below the grid: never over a tile
    m, l = state["m"].reshape(-1), state["l"].reshape(-1)
    acc = state["acc"].reshape(len(m), -1)
    lines = ["row   running max m   running sum l   partial output acc/l (first 3)"]
    for r in range(min(rows, len(m))):
        partial = (acc[r, :3] / l[r]).tolist() if l[r] > 0 else [0.0] * min(3, acc.shape[1])
        lines.append(f"{state['q_start'] + r:>3}   {m[r].item():>13.4f}   {l[r].item():>13.4f}   "
                     + "  ".join(f"{x:+.3f}" for x in partial))
    table.axis("off")
    table.text(0, 0.95, "\n".join(lines), family="monospace", fontsize=8, va="top")
    table.set_title("online-softmax state of the Q tile on chip")
    fig.tight_layout()
    return fig


def tile_stepper_widget(n_queries=12, n_keys=16, head_dim=4, block_m=4, block_n=4, is_causal=True, seed=0):
    """A slider over the steps of a tiled forward on random inputs (one head)."""
    if _outside_jupyter("tile_stepper_widget", "draw_tile_step(record_tiles(q, k, v, block_m, block_n, is_causal), "
                                               "step, n_queries, n_keys, block_m, block_n, is_causal)"):
        return None
    import ipywidgets as widgets

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, head_dim, generator=gen, dtype=torch.float64)
               for n in (n_queries, n_keys, n_keys))
    steps = record_tiles(q, k, v, block_m, block_n, is_causal)

    def show(step):
        draw_tile_step(steps, step, n_queries, n_keys, block_m, block_n, is_causal)
        plt.show()

    return widgets.interactive(show, step=widgets.IntSlider(0, 0, len(steps) - 1, description="step"))


def block_size_report(onchip_kib: int, head_dim: int, seq_len: int, dtype=torch.float16) -> str:
    """Block sizes FlashAttention would pick for M KiB of on-chip memory, what lives on
    chip, and the HBM bytes of the forward against naive attention (one head)."""
    m_bytes = onchip_kib * 1024
    block_m, block_n = blocks_for_onchip_memory(m_bytes, head_dim, dtype)
    b = dtype_bytes(dtype)
    on_chip = {"Q_i": block_m * head_dim * b, "K_j, V_j": 2 * block_n * head_dim * b,
               "O_i (acc)": block_m * head_dim * 4, "S_ij": block_m * block_n * 4}
    tiled = sum(tiled_forward_traffic(1, 1, seq_len, head_dim, dtype, block_m=block_m, block_n=block_n).values())
    naive = sum(s.total for s in naive_attention_traffic(1, 1, seq_len, head_dim, dtype))
    # Algorithm 1 sizes B_c = ⌈M/4d⌉ so that Q_i, K_j, V_j and O_i, in the input's dtype, fit in M
    # (B_r·d + 2·B_c·d + B_r·d ≤ 4·B_c·d elements). A kernel also holds the score tile S_ij and
    # keeps O_i in fp32, which that budget does not count.
    paper_budget = (2 * block_m + 2 * block_n) * head_dim * b
    lines = [f"M = {onchip_kib} KiB, d = {head_dim}: block_m (B_r) = {block_m}, block_n (B_c) = {block_n}"]
    lines += [f"  {name:>10}: {format_bytes(size)}" for name, size in on_chip.items()]
    lines.append(f"  Algorithm 1's budget (Q_i, K_j, V_j, O_i in the input dtype): {format_bytes(paper_budget)} ≤ M")
    lines.append(f"  on chip in all (fp32 O_i and S_ij included): {format_bytes(sum(on_chip.values()))}")
    traffic = f"HBM traffic of the forward, N = {seq_len:,}: tiled {format_bytes(tiled)}, naive {format_bytes(naive)}"
    if tiled <= naive:
        lines.append(f"{traffic} (naive moves {naive / tiled:.1f}x more than tiled)")
    else:
        # Each query block re-reads all of K and V: ⌈N/B_r⌉·2·N·d elements against naive's ≈ 4·N²,
        # so tiling only saves bytes once B_r ≳ d/2, i.e. M ≳ 2·d²·(bytes per element).
        passes = -(-seq_len // block_m)
        lines.append(f"{traffic} (tiled moves {tiled / naive:.1f}x MORE than naive)")
        lines.append(f"  with M this small and d this large the tiles are too small: each of the {passes:,} "
                     f"query blocks re-reads all of K and V, and with block_m = {block_m} below about "
                     f"d/2 = {head_dim // 2} that is more than naive's N × N matrices; tiling pays off "
                     f"from about M = {format_bytes(2 * head_dim * head_dim * b)} at this d")
    return "\n".join(lines)


def block_size_calculator_widget():
    """Sliders for on-chip memory, head dimension and sequence length."""
    if _outside_jupyter("block_size_calculator_widget", "print(block_size_report(onchip_kib, head_dim, seq_len))"):
        return None
    import ipywidgets as widgets

    def show(onchip_kib=96, head_dim=64, log2_seq_len=12):
        print(block_size_report(onchip_kib, head_dim, 2 ** log2_seq_len))

    return widgets.interactive(show, onchip_kib=(16, 228, 4), head_dim=[16, 32, 64, 128, 256],
                               log2_seq_len=(8, 16))


def number_formats_report(x: float) -> str:
    """How ``x`` is stored in fp32, tf32, fp16 and bf16: value, relative error, spacing."""
    import math

    from .number_formats import FORMATS, format_properties, round_to

    lines = [f"{'format':>6} {'stored value':>16} {'relative error':>15} {'gap to next value':>18}"]
    for name in FORMATS:
        stored = round_to(x, name)
        props = format_properties(name)
        err = abs(stored - x) / abs(x) if x else 0.0
        if math.isinf(stored):
            gap = float("nan")
        else:
            exponent = math.floor(math.log2(abs(stored))) if stored else 1 - (2 ** (props["exponent bits"] - 1) - 1)
            exponent = max(exponent, math.log2(props["smallest normal"]))
            gap = 2.0 ** (exponent - props["mantissa bits"])
        lines.append(f"{name:>6} {stored:>16.9g} {err:>15.2e} {gap:>18.3g}")
    return "\n".join(lines)


def number_formats_widget(value: float = 0.1):
    """Type a number, see what each floating-point format makes of it."""
    if _outside_jupyter("number_formats_widget", "print(number_formats_report(x))"):
        return None
    import html

    import ipywidgets as widgets

    box = widgets.FloatText(value=value, description="x =")
    table = widgets.HTML()

    def show(change=None):   # an HTML value, not print(): nothing reaches stdout without a browser
        table.value = f"<pre>{html.escape(number_formats_report(box.value))}</pre>"

    box.observe(show, names="value")
    show()
    return widgets.VBox([box, table])


def draw_decoding_step(coords, tour, probabilities, step: int):
    """The TSP decoder at ``step`` for one instance: the tour so far, and the probability it
    gives each city next (visited cities, masked out of the glimpse and the logits, get 0).
    ``coords (n, 2)``, ``tour (n,)``, ``probabilities (n steps, n)``."""
    import numpy as np

    xy, tour, p = np.asarray(coords), np.asarray(tour), np.asarray(probabilities[step])
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1.2, 1]})
    done = tour[:step]
    if len(done) > 1:                     # (one city is no line yet: the markers below show it)
        ax.plot(xy[done, 0], xy[done, 1], "-", color="tab:blue", lw=1.5, label="tour so far")
    if len(done):
        ax.plot(*xy[done[0]], "^", ms=10, mfc="none", mec="tab:orange", label="first city")
        ax.plot(*xy[done[-1]], "s", ms=9, mfc="none", mec="tab:blue", label="current city")
    points = ax.scatter(xy[:, 0], xy[:, 1], c=p, cmap="viridis", vmin=0, vmax=max(p.max(), 1e-9), s=40,
                        edgecolors="k", linewidths=0.5)
    ax.plot(*xy[tour[step]], "o", ms=14, mfc="none", mec="tab:red", label="chosen next")
    fig.colorbar(points, ax=ax, label="p(next city)")
    ax.set(xlabel="x", ylabel="y", aspect="equal", title=f"step {step + 1} of {len(tour)}")
    ax.legend(fontsize=7, loc="upper right")
    top = np.argsort(-p)[:6]
    bars.barh([f"city {i}" for i in top][::-1], p[top][::-1], color="tab:green")
    bars.set(xlabel="probability", xlim=(0, 1), title="most probable next cities")
    fig.tight_layout()
    return fig


def decoder_stepper_widget(model, coords):
    """A slider over the decoding steps of ``model`` (greedy) on one instance ``(n, 2)``."""
    if _outside_jupyter("decoder_stepper_widget", "draw_decoding_step(coords, tour, probabilities, step)"):
        return None
    import ipywidgets as widgets

    trace = []
    with torch.no_grad():
        tour, _ = model.eval()(coords[None], "greedy", trace=trace)
    probabilities = torch.cat(trace).float()

    def show(step):                       # the slider counts from 1, as the figure's title does
        draw_decoding_step(coords, tour[0], probabilities, step - 1)
        plt.show()

    return widgets.interactive(show, step=widgets.IntSlider(1, 1, len(trace), description="step"))
