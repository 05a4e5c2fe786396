"""Reading benchmark records: ratios against SDPA's backends, the course's performance
targets met or missed, power-law fits, and the plots of notebook 07.

A record is what ``python -m flashlab bench --out FILE`` writes: ``{"environment": …,
"rows": [{"impl", "B", "H", "N", "D", "causal", "dtype", "mode", "ms", "tflops",
"extra_bytes"}, …]}``.
"""

from __future__ import annotations

import math

# (mode, baseline, minimum ratio, smallest N, largest N): flashlab must reach
# time(baseline) / time(flashlab) ≥ minimum ratio for every dtype, D and causality.
TARGETS = [
    ("fwd", "sdpa_flash", 1.3, 2048, None),
    ("fwd", "sdpa_cudnn", 0.85, 2048, None),
    ("fwd", "sdpa_flash", 1.0, 512, 1024),
    ("fwd+bwd", "sdpa_flash", 1.15, 2048, None),
    ("fwd+bwd", "sdpa_cudnn", 0.75, 2048, None),
]
MEMORY_TARGET = 1.10     # extra memory of flashlab's fwd+bwd ≤ 1.10 × the flash backend's


def merge_records(*records: dict) -> dict:
    """One record from several runs on the same machine (e.g. more sequence lengths measured
    later). Each row keeps its ratios meaningful because every implementation of a shape was
    timed in the same run; the environments must agree."""
    first = records[0]["environment"]
    for other in records[1:]:
        if (other["environment"]["gpu"], other["environment"]["torch"]) != (first["gpu"], first["torch"]):
            raise ValueError(f"records: {other['environment']} was not measured where {first} was; "
                             "merge only runs of the same GPU and PyTorch.")
    return {"environment": first, "rows": [row for record in records for row in record["rows"]]}


def index(record: dict) -> dict:
    """(impl, N, D, causal, dtype, mode) → row, for rows that have a time."""
    return {(r["impl"], r["N"], r["D"], r["causal"], r["dtype"], r["mode"]): r for r in record["rows"] if "ms" in r}


def shapes(record: dict) -> list[tuple]:
    """The (N, D, causal, dtype) combinations flashlab was measured at, sorted."""
    return sorted({(r["N"], r["D"], r["causal"], r["dtype"]) for r in record["rows"] if r["impl"] == "flashlab"})


def target_table(record: dict) -> list[dict]:
    """One row per target and measured shape: the ratio and whether it meets the target."""
    rows, table = index(record), []
    for mode, baseline, minimum, n_min, n_max in TARGETS:
        for n, d, causal, dtype in shapes(record):
            if n < n_min or (n_max is not None and n > n_max):
                continue
            ours = rows.get(("flashlab", n, d, causal, dtype, mode))
            theirs = rows.get((baseline, n, d, causal, dtype, mode))
            if ours and theirs:
                ratio = theirs["ms"] / ours["ms"]
                table.append({"mode": mode, "baseline": baseline, "target": minimum, "N": n, "D": d, "causal": causal,
                              "dtype": dtype, "ratio": ratio, "met": ratio >= minimum})
    for n, d, causal, dtype in shapes(record):
        ours, theirs = rows.get(("flashlab", n, d, causal, dtype, "fwd+bwd")), rows.get(
            ("sdpa_flash", n, d, causal, dtype, "fwd+bwd"))
        if ours and theirs and ours.get("extra_bytes") and theirs.get("extra_bytes"):
            ratio = ours["extra_bytes"] / theirs["extra_bytes"]
            table.append({"mode": "memory fwd+bwd", "baseline": "sdpa_flash", "target": MEMORY_TARGET, "N": n, "D": d,
                          "causal": causal, "dtype": dtype, "ratio": ratio, "met": ratio <= MEMORY_TARGET})
    return table


def sdpa_backend_from_kernels(kernel_names) -> str:
    """Which SDPA backend ran, from the CUDA kernel names a profiler recorded. cuDNN's
    kernels carry "flash" in their names too (…_sdpa_sm90_flash_fprop_…), so "cudnn" is
    looked for first."""
    text = " ".join(kernel_names).lower()
    for marker, name in (("cudnn", "cudnn"), ("fmha", "efficient"), ("efficient", "efficient"), ("flash", "flash")):
        if marker in text:
            return name
    return "math"


def fit_power_law(xs, ys) -> float:
    """Least-squares exponent p of y ≈ c·x^p (a straight line in log–log)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def plot_tflops(record: dict, dtype: str, mode: str, axes, impls=None):
    """TFLOP/s against N, one panel per (D, causal) on ``axes`` (4 of them)."""
    rows = index(record)
    impls = impls or sorted({r["impl"] for r in record["rows"]})
    panels = sorted({(d, c) for _, d, c, dt in shapes(record) if dt == dtype})
    for ax, (d, causal) in zip(axes, panels):
        for impl in impls:
            points = sorted((n, r["tflops"]) for (i, n, dd, c, dt, m), r in rows.items()
                            if (i, dd, c, dt, m) == (impl, d, causal, dtype, mode))
            if points:
                ax.plot(*zip(*points), "o-", label=impl, lw=1, ms=3)
        ax.set(xscale="log", xlabel="sequence length N", ylabel="TFLOP/s",
               title=f"D={d}, {'causal' if causal else 'full'}")
    # beside the last panel, not over the curves (at large N they crowd the top of every panel)
    axes[len(panels) - 1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)


def plot_memory(record: dict, dtype: str, d: int, causal: bool, ax, mode: str = "fwd+bwd"):
    """Extra memory (peak above the inputs) against N, log scale, per implementation."""
    rows = index(record)
    for impl in sorted({r["impl"] for r in record["rows"]}):
        points = sorted((n, r["extra_bytes"] / 2**20) for (i, n, dd, c, dt, m), r in rows.items()
                        if (i, dd, c, dt, m) == (impl, d, causal, dtype, mode) and r.get("extra_bytes"))
        if points:
            ax.plot(*zip(*points), "o-", label=impl, lw=1, ms=3)
    ax.set(xscale="log", yscale="log", xlabel="sequence length N (B·N fixed)", ylabel="extra memory (MiB)",
           title=f"{mode}, D={d}, {'causal' if causal else 'full'}")
    ax.legend(fontsize=7)


def autotune_choices(record: dict) -> dict:
    """(kernel, D, causal) → {chosen config: number of tuned shapes}, from the tuning log that
    ``python -m flashlab bench`` stores in a record (``autotune.Autotuner.report``)."""
    choices: dict = {}
    for entry in record.get("autotune", []):
        kernel, head_dim, causal = entry["key"][0], entry["key"][3], entry["key"][4]
        counts = choices.setdefault((kernel, head_dim, causal), {})
        counts[entry["chosen"]] = counts.get(entry["chosen"], 0) + 1
    return choices


def tuned_entries(record: dict, kernel: str = "forward") -> dict:
    """(N, D, causal, dtype) → the tuning log's entry for ``kernel`` at that shape, without mask or dropout:
    its "chosen" configuration and "ms", each candidate's launch alone timed by the tuner (no
    ``flashlab.attention`` around it), from the record ``python -m flashlab bench`` stores."""
    return {(entry["key"][8], entry["key"][3], entry["key"][4], entry["key"][2]): entry
            for entry in record.get("autotune", [])
            if entry["key"][0] == kernel and not any(entry["key"][5:7])}

