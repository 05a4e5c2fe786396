"""How much memory a run or an evaluation needs at least, checked against the device before
anything is allocated: an impossible size (a sequence of 10^8 tokens, a model 10^8 wide, TSP
instances of 10^8 cities) is refused in one line with the estimate, instead of the allocator's
traceback or the kernel's out-of-memory killer minutes later.

The estimates are lower bounds, counting only what must be held at once (the weights, their
gradients and AdamW's two moments; the batch; the activations a backward pass must keep): a
refused size cannot run, and a size that passes may still run out near the limit.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from .config import ConfigError


def _cgroup_room() -> int | None:
    """Bytes this process's control group may still take (cgroup v2 ``memory.max`` less
    ``memory.current``), None without a limit."""
    base = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError, ValueError):
        limit = (base / "memory.max").read_text().strip()
        if limit != "max":
            return max(0, int(limit) - int((base / "memory.current").read_text()))
    return None


def available_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes free, where) on ``device``: on a GPU what ``torch.cuda.mem_get_info`` says is free;
    on a CPU the memory the kernel says is available (MemAvailable in /proc/meminfo, else
    ``os.sysconf``), less where a control group sets a lower limit."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"GPU {device.index if device.index is not None else torch.cuda.current_device()}"
    free = None
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            line = next(line for line in f if line.startswith("MemAvailable:"))
        free = int(line.split()[1]) * 1024
    if free is None:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    room = _cgroup_room()
    if free is None and room is None:
        return 2**63, "this machine"                  # nothing says: nothing is refused
    return min(x for x in (free, room) if x is not None), "this machine"


def size(n: float) -> str:
    """Bytes in binary units: "1.5 GiB", "3.4 EiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def check_fits(needs: dict[str, float], device: torch.device, blame: tuple[str, object], copies: int = 1) -> None:
    """Raise `ConfigError` on the field ``blame`` = (name, value) if the parts of ``needs``
    (what → bytes), ``copies`` times (processes on one machine), exceed what ``device`` has free."""
    total = copies * sum(needs.values())
    free, where = available_bytes(device)
    if total <= free:
        return
    parts = "; ".join(f"{what} {size(n)}" for what, n in needs.items() if n >= 2**20 or len(needs) == 1)
    per = f", per process, {copies} processes" if copies > 1 else ""
    name, value = blame
    raise ConfigError(name, f"{value} needs at least {size(total)} of memory ({parts}{per}), more than the "
                            f"{size(free)} {where} has free; give a smaller value.")


def most_costly(full: float, without: dict[str, float]) -> str | None:
    """The setting to name in a refusal: of ``without`` (setting → the estimate with that setting
    at its default), the one that shrinks the ``full`` estimate the most; None if none does."""
    name, smaller = min(without.items(), key=lambda item: item[1], default=(None, full))
    return name if smaller < full else None


def tsp_evaluation_needs(n_nodes: int, instances: int, embed_dim: int, batch_size: int = 1000) -> dict[str, float]:
    """What `flashlab.train.tsp.evaluate` holds at least: the instances, their tours and the
    distance matrix of every instance (the heuristics), and one batch of the model's cities."""
    batch = min(batch_size, instances)
    return {"instances and tours": instances * n_nodes * (2 * 4 + 8),
            "the heuristics' distance matrices": instances * n_nodes * n_nodes * 4,
            "the model's embeddings of a batch": batch * n_nodes * embed_dim * 4 * 4}


def check_tsp_evaluation_fits(nodes: int, instances: int, embed_dim: int, device: torch.device,
                              trained_nodes: int | None, default_instances: int) -> None:
    """Raise `ConfigError` on ``nodes`` or ``instances`` (whichever costs more against the model's
    own city count and the default instance count) if `tsp_evaluation_needs` exceeds what
    ``device`` has free: eval-tsp's check before it draws the instances."""
    needs = tsp_evaluation_needs(nodes, instances, embed_dim)
    full = sum(needs.values())
    if full <= available_bytes(device)[0]:
        return
    without = {"nodes": sum(tsp_evaluation_needs(trained_nodes or 3, instances, embed_dim).values()),
               "instances": sum(tsp_evaluation_needs(nodes, min(instances, default_instances), embed_dim).values())}
    name = most_costly(full, without) or "instances"
    check_fits(needs, device, (name, nodes if name == "nodes" else instances))
