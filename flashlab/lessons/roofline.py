"""The roofline of notebook 02: attainable FLOP/s against arithmetic intensity (FLOPs per byte of
HBM traffic), with the ops of an attention placed on it. An op's point is min(its peak FLOP/s,
intensity × bandwidth): below the ridge point it is limited by the bytes it moves."""


def op_labels(intensities: dict[str, float]) -> list[tuple[float, str, list[str]]]:
    """(intensity, label, names) per distinct intensity, rounded to 0.1 FLOP/byte, lowest first. Ops of
    equal intensity share one point and one label ("6 matmuls: S, O, dV, …", each name cut at " ="); a
    lone op keeps its name, cut at " =" when longer than 20 characters."""
    groups: dict[float, list[str]] = {}
    for name, intensity in intensities.items():
        groups.setdefault(round(intensity, 1), []).append(name)
    labels = []
    for intensity, names in sorted(groups.items()):
        label = (f"{len(names)} matmuls: " + ", ".join(n.split(" =")[0] for n in names)) if len(names) > 1 \
            else names[0]
        labels.append((intensity, label if len(label) <= 20 else label.split(" =")[0], names))
    return labels


def draw_roofline(ax, bytes_per_s: float, roofs: dict[str, float], ops: dict[str, tuple[float, float]]) -> None:
    """Draw on ``ax`` (log-log, TFLOP/s) one roof per entry of ``roofs`` (label → peak FLOP/s; the first
    solid, the others dashed) over the bandwidth ``bytes_per_s``, and a labelled point per group of
    ``ops`` (name → (FLOP/byte, the peak FLOP/s that op can reach))."""
    intensity = [2 ** (x / 8) for x in range(-24, 97)]      # fine enough to show the ridge where it is
    for n, (label, peak) in enumerate(roofs.items()):
        ax.loglog(intensity, [min(peak, i * bytes_per_s) / 1e12 for i in intensity], "k-" if n == 0 else "k--",
                  lw=1.5 if n == 0 else 0.8, label=label)
    for n, (i, label, names) in enumerate(op_labels({name: op[0] for name, op in ops.items()})):
        y = min(ops[names[0]][1], i * bytes_per_s) / 1e12
        ax.plot(i, y, "o")
        above_left = n % 2 == 1                   # alternate sides of the roofline so neighbours never overlap
        ax.annotate(f"{label}\n({i} FLOP/byte)", (i, y), xytext=(-8, 8) if above_left else (8, -22),
                    textcoords="offset points", fontsize=7, ha="right" if above_left else "left")
    ax.set(xlabel="arithmetic intensity (FLOP / byte of HBM traffic)", ylabel="attainable TFLOP/s")
