"""Exercise 11: the mbarrier phase bookkeeping of a multi-stage ring buffer (notebook 11_hopper).

A warp-specialised Hopper kernel streams key/value blocks through a ring of S shared-memory
slots. Iteration i (the i-th key block) uses slot i mod S; the i-th block is the slot's
(i // S)-th use, its *round*. Each slot has two mbarriers, each counting completed phases:
"ready" completes a phase when a copy into the slot has landed, "empty" when the consumer has
read the slot and released it. A wait names the parity (0 or 1) of the phase it waits for:
``mbarrier.wait(bar, parity)`` returns once that phase has completed, that is while the phase in
progress has the other parity. A fresh barrier is in phase 0: a wait on parity 1 passes at once.

- The consumer, before reading iteration i, waits on the slot's "ready" for the round's phase.
- The producer, before refilling the slot for iteration i, waits on its "empty" for the round's
  phase flipped: in round 0 the slot was never used, so the wait must pass at once; in round r ≥ 1
  it must wait for the consumer's r-th release.

Test: ``make test-ex EX=11`` (no GPU needed: a Python model of the ring runs your rule)
"""


def slot_and_phase(i: int, stages: int) -> tuple[int, int]:
    """The slot of iteration ``i`` (an int ≥ 0) in a ring of ``stages`` slots (an int ≥ 1), and
    the phase bit of its round: ``(slot, phase)``, ``0 <= slot < stages``, ``phase`` 0 or 1."""
    raise NotImplementedError


def producer_wait(i: int, stages: int) -> tuple[int, int]:
    """``(slot, parity)``: the slot the producer refills for iteration ``i`` and the parity it waits
    for on that slot's "empty" barrier first (round 0 must pass at once on a fresh barrier)."""
    raise NotImplementedError


def consumer_wait(i: int, stages: int) -> tuple[int, int]:
    """``(slot, parity)``: the slot the consumer reads for iteration ``i`` and the parity it waits
    for on that slot's "ready" barrier first (round 0 waits for the first copy to land)."""
    raise NotImplementedError
