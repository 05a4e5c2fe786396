"""Exercise 11, reference answer: the mbarrier phase bookkeeping of a multi-stage ring buffer."""


def slot_and_phase(i: int, stages: int) -> tuple[int, int]:
    """The slot of iteration ``i`` and the phase bit of its round."""
    return i % stages, (i // stages) % 2               # round i // S, its parity


def producer_wait(i: int, stages: int) -> tuple[int, int]:
    """The slot the producer refills and the parity it waits for on its "empty" barrier."""
    slot, phase = slot_and_phase(i, stages)
    return slot, phase ^ 1                             # round 0: parity 1, passes on a fresh barrier


def consumer_wait(i: int, stages: int) -> tuple[int, int]:
    """The slot the consumer reads and the parity it waits for on its "ready" barrier."""
    slot, phase = slot_and_phase(i, stages)
    return slot, phase                                 # round r: the slot's (r + 1)-th landing
