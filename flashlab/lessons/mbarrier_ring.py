"""A model of the shared-memory ring a warp-specialised Hopper kernel streams K and V through, with
its mbarriers, in plain Python: what notebook 11 steps through and exercise 11's tests run.

A ring of ``stages`` slots. Iteration i (the i-th key block) goes to slot ``i % stages``. Each slot
has two mbarriers: "ready" completes a phase when the copy into the slot has landed (the TMA engine
arrives on it), "empty" completes a phase when the consumer has read the slot and releases it. A
producer (the load warp) waits on a slot's "empty" before refilling it; a consumer (the softmax
warps) waits on its "ready" before reading it.

An mbarrier counts arrivals; when the expected number has arrived, the phase in progress completes
and the next one begins. A wait names a *parity* (0 or 1), not a phase number:
``mbarrier.wait(bar, parity)`` returns once the phase of that parity has completed, i.e. while the
phase in progress has the other parity. A fresh barrier is in phase 0, so a wait on parity 1 passes
at once (as if a phase −1 had completed) and a wait on parity 0 blocks until the first completion.

`simulate` runs a producer, the copy engine and a consumer against these barriers, in an order
chosen by a policy, with the waits given as functions ``wait(i, stages) -> (slot, parity)``. It
stops at the first of: a deadlock (no actor can move), a read of a slot that does not hold the
iteration read (not landed yet, or overwritten), a refill of a slot whose data is not read yet, or a
wait outside the ring. `KERNEL_RULE` is the rule `flashlab.kernels.gluon_hopper` uses.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


class MBarrier:
    """An mbarrier: ``count`` arrivals complete the phase in progress; ``completed`` phases so far."""

    def __init__(self, count: int = 1):
        self.count, self.pending, self.completed = count, count, 0

    @property
    def parity(self) -> int:
        """Parity of the phase in progress (0 for a fresh barrier)."""
        return self.completed & 1

    def passes(self, parity: int) -> bool:
        """Whether ``wait(parity)`` returns now: the phase of that parity has completed, i.e. the
        phase in progress has the other parity."""
        return parity != self.parity

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.completed, self.pending = self.completed + 1, self.count


def _kernel_producer_wait(i: int, stages: int) -> tuple[int, int]:
    return i % stages, ((i // stages) & 1) ^ 1        # slot's "empty": the round's phase, flipped


def _kernel_consumer_wait(i: int, stages: int) -> tuple[int, int]:
    return i % stages, (i // stages) & 1              # slot's "ready": the round's phase


# (producer's wait on "empty", consumer's wait on "ready") as the Gluon forward computes them
KERNEL_RULE = (_kernel_producer_wait, _kernel_consumer_wait)

ORDERS = ("producer first", "consumer first", "copies late")


@dataclass
class RingRun:
    """What `simulate` saw: one entry of ``events`` per move (its snapshot of the ring after it), the
    iterations the consumer read, in order (``reads``), and ``error`` (None when all ``n`` iterations
    were read from the right slots)."""
    n: int
    stages: int
    order: str | int
    events: list[dict] = field(default_factory=list)
    reads: list[int] = field(default_factory=list)
    error: str | None = None
    kind: str | None = None          # "deadlock", "bad read", "overwrite", "invalid wait"


class _Ring:
    def __init__(self, n, stages, producer_wait, consumer_wait):
        self.n, self.stages = n, stages
        self.producer_wait, self.consumer_wait = producer_wait, consumer_wait
        self.ready = [MBarrier() for _ in range(stages)]
        self.empty = [MBarrier() for _ in range(stages)]
        self.slots: list[tuple[str, int | None]] = [("free", None)] * stages   # ("free"|"loading"|"full", i)
        self.next_load = self.next_read = 0
        self.in_flight: list[int] = []                                        # slots with a copy in flight

    def wait_of(self, who: str, i: int):
        fn = self.producer_wait if who == "producer" else self.consumer_wait
        slot, parity = fn(i, self.stages)
        if not (isinstance(slot, int) and 0 <= slot < self.stages):
            raise _Stop("invalid wait", f"the {who}'s wait for iteration {i} names slot {slot!r}: a slot is an "
                                        f"int in 0 … {self.stages - 1} ({self.stages} stages)")
        if parity not in (0, 1) or isinstance(parity, bool):
            raise _Stop("invalid wait", f"the {who}'s wait for iteration {i} names parity {parity!r}: an "
                                        "mbarrier wait takes a phase parity, 0 or 1")
        return slot, parity

    def movable(self) -> list[str]:
        """The actors that can move now (a waiting actor moves once its barrier passes)."""
        actors = []
        if self.next_load < self.n:
            slot, parity = self.wait_of("producer", self.next_load)
            if self.empty[slot].passes(parity):
                actors.append("producer")
        if self.in_flight:
            actors.append("copy")
        if self.next_read < self.n:
            slot, parity = self.wait_of("consumer", self.next_read)
            if self.ready[slot].passes(parity):
                actors.append("consumer")
        return actors

    def move(self, actor: str) -> str:
        if actor == "producer":
            i = self.next_load
            slot, parity = self.wait_of("producer", i)
            state, held = self.slots[slot]
            if state != "free":
                what = "a copy still in flight" if state == "loading" else "data the consumer has not read"
                raise _Stop("overwrite", f"the producer refills slot {slot} with iteration {i} while it holds "
                                         f"iteration {held} ({what}): its wait on empty[{slot}] for parity "
                                         f"{parity} passed too early")
            self.slots[slot] = ("loading", i)
            self.in_flight.append(slot)
            self.next_load += 1
            return f"producer: empty[{slot}] parity {parity} passed; copy of iteration {i} into slot {slot} issued"
        if actor == "copy":
            slot = self.in_flight.pop(0)
            self.slots[slot] = ("full", self.slots[slot][1])
            self.ready[slot].arrive()
            return f"copy: iteration {self.slots[slot][1]} landed in slot {slot}; ready[{slot}] completes a phase"
        i = self.next_read
        slot, parity = self.wait_of("consumer", i)
        state, held = self.slots[slot]
        if (state, held) != ("full", i):
            what = {"free": "nothing (empty)", "loading": f"iteration {held}, its copy still in flight",
                    "full": f"iteration {held}"}[state]
            raise _Stop("bad read", f"the consumer reads slot {slot} as iteration {i}, but it holds {what}: its "
                                    f"wait on ready[{slot}] for parity {parity} passed too early")
        self.slots[slot] = ("free", None)
        self.empty[slot].arrive()
        self.next_read += 1
        return f"consumer: ready[{slot}] parity {parity} passed; read iteration {i}, released slot {slot}"

    def deadlock(self) -> str:
        waits = []
        for who, i, bars, name in (("producer", self.next_load, self.empty, "empty"),
                                   ("consumer", self.next_read, self.ready, "ready")):
            if i < self.n:
                slot, parity = self.wait_of(who, i)
                bar = bars[slot]
                waits.append(f"the {who} waits on {name}[{slot}] for parity {parity} at iteration {i} "
                             f"({bar.completed} phase(s) of it completed, the one in progress has parity {bar.parity})")
        return "deadlock: " + "; ".join(waits)

    def snapshot(self, actor: str, action: str) -> dict:
        waits = {}
        for who, i, bars in (("producer", self.next_load, self.empty), ("consumer", self.next_read, self.ready)):
            try:
                slot, parity = self.wait_of(who, i) if i < self.n else (None, None)
            except _Stop:                                  # reported when that actor tries to move
                slot = parity = None
            waits[who] = None if slot is None else (slot, parity, bars[slot].passes(parity))
        return {"actor": actor, "action": action, "slots": list(self.slots), "waits": waits,
                "ready_completed": [b.completed for b in self.ready],
                "empty_completed": [b.completed for b in self.empty],
                "next_load": self.next_load, "next_read": self.next_read}


class _Stop(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _choose(order, actors: list[str], rng: random.Random | None) -> str:
    if rng is not None:
        return rng.choice(actors)
    preference = {"producer first": ("producer", "copy", "consumer"),
                  "consumer first": ("consumer", "copy", "producer"),
                  "copies late": ("producer", "consumer", "copy")}[order]
    return next(a for a in preference if a in actors)


def simulate(n: int, stages: int, producer_wait=None, consumer_wait=None, order: str | int = "producer first",
             max_moves: int = 10_000) -> RingRun:
    """Stream ``n`` iterations through a ring of ``stages`` slots. ``producer_wait(i, stages)`` and
    ``consumer_wait(i, stages)`` return the (slot, parity) each waits on for iteration i (default:
    `KERNEL_RULE`). ``order``: which of the actors that can move moves next, one of `ORDERS`
    ("copies late": copies land only when nothing else can move), or an int seeding a random choice."""
    if not (isinstance(n, int) and n >= 0):
        raise ValueError(f"n={n!r}: the number of iterations must be an int ≥ 0")
    if not (isinstance(stages, int) and stages >= 1):
        raise ValueError(f"stages={stages!r}: the ring needs an int ≥ 1 of slots")
    if not isinstance(order, int) and order not in ORDERS:
        raise ValueError(f"order={order!r}: use one of {ORDERS} or an int seed")
    ring = _Ring(n, stages, producer_wait or KERNEL_RULE[0], consumer_wait or KERNEL_RULE[1])
    rng = random.Random(order) if isinstance(order, int) and not isinstance(order, bool) else None
    run = RingRun(n, stages, order)
    run.events.append(ring.snapshot("start", f"{stages} empty slots, every barrier in phase 0"))
    try:
        while ring.next_read < n and len(run.events) <= max_moves:
            actors = ring.movable()
            if not actors:
                raise _Stop("deadlock", ring.deadlock())
            actor = _choose(order, actors, rng)
            run.events.append(ring.snapshot(actor, ring.move(actor)))
            if actor == "consumer":
                run.reads.append(ring.next_read - 1)
    except _Stop as stop:
        run.error, run.kind = str(stop), stop.kind
    return run


def ring_table(run: RingRun, last: int | None = None) -> str:
    """The run as text, one line per move: who moved, the slots after it (iteration held, `·` free,
    `~` a copy in flight) and each barrier's parity (of its phase in progress)."""
    lines = [f"{'#':>3}  {'slots':<{4 * run.stages + 2}} {'ready':<{2 * run.stages + 1}} "
             f"{'empty':<{2 * run.stages + 1}} move"]
    for k, e in enumerate(run.events[:last]):
        slots = " ".join({"free": "·", "loading": f"~{i}", "full": f"{i}"}[s].rjust(3) for s, i in e["slots"])
        ready = " ".join(str(c & 1) for c in e["ready_completed"])
        empty = " ".join(str(c & 1) for c in e["empty_completed"])
        lines.append(f"{k:>3}  {slots:<{4 * run.stages + 2}} {ready:<{2 * run.stages + 1}} "
                     f"{empty:<{2 * run.stages + 1}} {e['action']}")
    if run.error and (last is None or last >= len(run.events)):
        lines.append(f"  stop: {run.error}")
    return "\n".join(lines)


_COLOURS = {"free": "white", "loading": "#f6c88f", "full": "#9fd49f"}


def draw_ring_step(run: RingRun, step: int):
    """Figure of the ring after move ``step``: each slot (what it holds), its two barriers' phase
    parity and completed phases, and where the producer and the consumer stand."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    e = run.events[step]
    s = run.stages
    fig, ax = plt.subplots(figsize=(1.8 * s + 4.5, 3.8))
    for k, (state, held) in enumerate(e["slots"]):
        ax.add_patch(Rectangle((k, 0), 0.9, 1, facecolor=_COLOURS[state], edgecolor="k"))
        label = {"free": "free", "loading": f"copy of\nK,V {held}\nin flight", "full": f"K,V {held}\nlanded"}[state]
        ax.text(k + 0.45, 0.5, label, ha="center", va="center", fontsize=9)
        ready, empty = e["ready_completed"][k], e["empty_completed"][k]
        ax.text(k + 0.45, -0.1, f"ready: parity {ready & 1}\n({ready} done)", ha="center", va="top", fontsize=8)
        ax.text(k + 0.45, -0.75, f"empty: parity {empty & 1}\n({empty} done)", ha="center", va="top", fontsize=8)
    # the producer's arrow on a slot's left, its label to the left; the consumer's on the right
    for who, i, bar, x, align, colour in (("producer", e["next_load"], "empty", 0.2, "right", "tab:orange"),
                                          ("consumer", e["next_read"], "ready", 0.7, "left", "tab:green")):
        wait = e["waits"][who]
        if i < run.n and wait is not None:
            slot, parity, passes = wait
            state = "passes" if passes else "blocked"
            label = f"{who}: iteration {i}\nwaits {bar}[{slot}] for parity {parity}: {state}"
            ax.annotate(label, (slot + x, 1.02), (slot + x, 1.6), ha=align, va="bottom",
                        fontsize=8, color=colour, arrowprops={"arrowstyle": "->", "color": colour})
    ax.set(xlim=(-1.6, s + 1.5), ylim=(-1.5, 2.2), xticks=[k + 0.45 for k in range(s)],
           xticklabels=[f"slot {k}" for k in range(s)], yticks=[],
           xlabel="shared-memory slot of the K/V ring (index = iteration mod stages)")
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
    ax.set_title(f"move {step}/{len(run.events) - 1}: {e['action']}", fontsize=9, pad=28)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.tight_layout()
    return fig


def ring_stepper_widget(n: int = 6, stages: int = 2, order: str | int = "producer first"):
    """A slider over the moves of ``simulate(n, stages, order=order)`` with the kernel's rule."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    run = simulate(n, stages, order=order)

    def show(move):
        draw_ring_step(run, move)
        plt.show()

    return widgets.interactive(show, move=widgets.IntSlider(0, 0, len(run.events) - 1, description="move"))
