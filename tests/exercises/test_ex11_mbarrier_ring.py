"""Tests for exercise 11 (the mbarrier phase bookkeeping of a ring buffer): the slot and phase of
every iteration, the parity each side waits for, and the ring run with your rule by a Python
model of the kernel's producer, copy engine and consumer (`flashlab.lessons.mbarrier_ring`), in
several orders, which stops at a deadlock, a read of a slot that does not hold the iteration read,
or a refill of a slot not yet read."""

import pytest

from flashlab.lessons.mbarrier_ring import ORDERS, simulate
from tests.exercises.hints import require

# every (i, stages) the tables are checked on: up to five stages, each ring wrapping three times and more
GRID = [(i, s) for s in range(1, 6) for i in range(3 * s + 2)]

# the usual slips, as the (slot, parity) each function would return, each with the hint that names it
_ROUND = {"right": lambda i, s: (i // s) % 2, "per iteration": lambda i, s: i % 2, "unbounded": lambda i, s: i // s}
HINTS = {
    "slot is the round": "slot = i // S is the round (how many times the ring has wrapped), not the slot: consecutive "
                         "iterations then share slot 0 and the producer refills it before it is read. The slot is "
                         "i mod S; the round is i // S and its phase bit (i // S) mod 2",
    "phase per iteration": "the phase bit flips every iteration (i mod 2): a slot's barriers complete one phase per "
                           "use of the slot, that is once per round of S iterations, so the phase bit is the round's "
                           "parity, (i // S) mod 2",
    "unbounded phase": "the phase is the round number i // S itself: a wait takes a parity, 0 or 1 (the barrier keeps "
                       "only the parity of its phase in progress): (i // S) mod 2",
    "producer not flipped": "the producer waits on 'empty' with the round's phase itself. In round 0 no consumer has "
                            "released the slot yet, so a wait for parity 0 on a fresh 'empty' barrier never returns: "
                            "the first copy is never issued and the consumer waits for it forever (deadlock). Flip it: "
                            "parity = phase ^ 1 (round 0 waits for parity 1, which a fresh barrier passes at once)",
    "producer one ahead": "the producer counts its round one iteration ahead ((i + 1) // S): for the last slot of "
                          "round 0 (i = S − 1) it waits for a release of the slot that can only come after it has "
                          "filled it (deadlock). Iteration i is in round i // S for the producer as for the consumer; "
                          "the producer's lead of S iterations comes from the flip, not from the round",
    "consumer flipped": "the consumer waits on 'ready' with the phase flipped: on a fresh 'ready' barrier parity 1 "
                        "passes at once, so the consumer reads a slot before its copy has landed (or waits a round "
                        "late). Only the producer's wait is flipped; the consumer waits for the round's phase",
}
CANDIDATES = {
    "slot_and_phase": {"slot is the round": lambda i, s: (i // s, (i // s) % 2),
                       "phase per iteration": lambda i, s: (i % s, i % 2),
                       "unbounded phase": lambda i, s: (i % s, i // s)},
    "producer_wait": {"slot is the round": lambda i, s: (i // s, (i // s) % 2 ^ 1),
                      "phase per iteration": lambda i, s: (i % s, i % 2 ^ 1),
                      "unbounded phase": lambda i, s: (i % s, i // s ^ 1),
                      "producer not flipped": lambda i, s: (i % s, (i // s) % 2),
                      "producer one ahead": lambda i, s: (i % s, ((i + 1) // s) % 2 ^ 1)},
    "consumer_wait": {"slot is the round": lambda i, s: (i // s, (i // s) % 2),
                      "phase per iteration": lambda i, s: (i % s, i % 2),
                      "unbounded phase": lambda i, s: (i % s, i // s),
                      "consumer flipped": lambda i, s: (i % s, (i // s) % 2 ^ 1)},
}
RIGHT = {"slot_and_phase": lambda i, s: (i % s, (i // s) % 2),
         "producer_wait": lambda i, s: (i % s, (i // s) % 2 ^ 1),
         "consumer_wait": lambda i, s: (i % s, (i // s) % 2)}


def _table(fn):
    """fn on every point of GRID, or None if it raises (not written yet, or a crash the test reports)."""
    try:
        return [tuple(fn(i, s)) for i, s in GRID]
    except Exception:
        return None


def _hints(exercise, names=("slot_and_phase", "producer_wait", "consumer_wait")) -> str:
    """``"\\nhint: …"`` for each of the functions ``names`` whose table is one of the usual slips."""
    found: dict[str, list[str]] = {}                      # slip -> the functions that make it
    for name in names:
        got = _table(getattr(exercise, name))
        for slip, candidate in CANDIDATES[name].items():
            if got == [candidate(i, s) for i, s in GRID]:
                found.setdefault(slip, []).append(name)
    return "".join(f"\nhint ({', '.join(where)}): {HINTS[slip]}" for slip, where in found.items())


def _check_table(exercise, name):
    fn = getattr(exercise, name)
    for i, s in GRID:
        got, want = fn(i, s), RIGHT[name](i, s)
        if tuple(got) != want:
            raise AssertionError(f"{name}(i={i}, stages={s}) = {got!r}, want {want!r}{_hints(exercise, (name,))}")


def test_slot_and_phase(exercise):
    got = exercise.slot_and_phase(0, 1)
    require(isinstance(got, tuple) and len(got) == 2, f"slot_and_phase(0, 1) = {got!r}: return a tuple (slot, phase)")
    _check_table(exercise, "slot_and_phase")


def test_consumer_waits_on_ready_for_the_rounds_phase(exercise):
    _check_table(exercise, "consumer_wait")


def test_producer_waits_on_empty_for_the_flipped_phase(exercise):
    first = [exercise.producer_wait(i, 3)[1] for i in range(3)]
    require(first == [1, 1, 1], (
        f"round 0 (i = 0, 1, 2 with 3 stages): the producer waits for parities {first}; it must pass at once on "
        f"fresh 'empty' barriers, so parity 1{_hints(exercise, ('producer_wait',))}"))
    _check_table(exercise, "producer_wait")


@pytest.mark.parametrize("order", [*ORDERS, 0, 1, 2], ids=str)
def test_the_ring_streams_every_iteration_in_order(exercise, order):
    """Your waits run the ring for 1-4 stages, as many iterations as fit in one round, two and a
    half, and more, with the actors moving in the order named (an int: a random order of that seed)."""
    for stages in (1, 2, 3, 4):
        for n in (1, stages + 1, 2 * stages + stages // 2 + 1, 9):
            run = simulate(n, stages, exercise.producer_wait, exercise.consumer_wait, order=order)
            require(run.error is None, (
                f"{stages} stages, {n} iterations, order {order!r}: {run.error}{_hints(exercise)}"))
            require(run.reads == list(range(n)), f"{stages} stages, {n} iterations: the consumer read {run.reads}")
