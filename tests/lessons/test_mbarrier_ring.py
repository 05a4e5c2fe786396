"""flashlab.lessons.mbarrier_ring: the ring model notebook 11 steps through and exercise 11's tests run."""

import pytest

from flashlab.lessons.mbarrier_ring import KERNEL_RULE, ORDERS, MBarrier, draw_ring_step, ring_table, simulate


def test_an_mbarrier_wait_names_a_parity():
    bar = MBarrier(count=2)
    assert bar.passes(1) and not bar.passes(0)             # fresh: phase 0 in progress, "phase −1" done
    bar.arrive()
    assert not bar.passes(0) and bar.completed == 0         # one arrival of two: no phase completes
    bar.arrive()
    assert bar.passes(0) and not bar.passes(1) and bar.completed == 1


@pytest.mark.parametrize("order", [*ORDERS, *range(8)], ids=str)
def test_the_kernels_rule_streams_every_iteration_once_in_order(order):
    for stages in (1, 2, 3, 5):
        for n in (0, 1, stages, 2 * stages + 1, 17):
            run = simulate(n, stages, *KERNEL_RULE, order=order)
            assert run.error is None, (stages, n, run.error)
            assert run.reads == list(range(n))
            assert [e["action"] for e in run.events if e["actor"] == "consumer"] == [
                f"consumer: ready[{i % stages}] parity {(i // stages) % 2} passed; read iteration {i}, released slot "
                f"{i % stages}" for i in range(n)]


def test_wrong_rules_are_stopped_at_the_first_fault():
    slot = lambda i, s: i % s                                               # noqa: E731
    not_flipped = simulate(4, 2, lambda i, s: (slot(i, s), (i // s) % 2), KERNEL_RULE[1])
    assert not_flipped.kind == "deadlock" and "empty[0] for parity 0 at iteration 0" in not_flipped.error
    early_read = simulate(4, 2, KERNEL_RULE[0], lambda i, s: (slot(i, s), (i // s) % 2 ^ 1), order="consumer first")
    assert early_read.kind == "bad read" and "holds nothing" in early_read.error
    same_slot = simulate(4, 2, lambda i, s: (i // s, (i // s) % 2 ^ 1), lambda i, s: (i // s, (i // s) % 2))
    assert same_slot.kind == "overwrite" and "slot 0 with iteration 1" in same_slot.error
    outside = simulate(4, 2, lambda i, s: (i, 1), KERNEL_RULE[1])
    assert outside.kind == "invalid wait" and "slot 2" in outside.error
    not_a_bit = simulate(5, 2, KERNEL_RULE[0], lambda i, s: (slot(i, s), i // s))
    assert not_a_bit.kind == "invalid wait" and "iteration 4 names parity 2" in not_a_bit.error


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="stages=0"):
        simulate(3, 0)
    with pytest.raises(ValueError, match="n=-1"):
        simulate(-1, 2)
    with pytest.raises(ValueError, match="order='sideways'"):
        simulate(3, 2, order="sideways")


def test_table_and_figure_of_a_run():
    run = simulate(3, 2)
    table = ring_table(run)
    assert len(table.splitlines()) == len(run.events) + 1 and "stop:" not in table
    assert "stop: deadlock" in ring_table(simulate(2, 2, lambda i, s: (i % s, 0), KERNEL_RULE[1]))
    import matplotlib
    matplotlib.use("Agg")
    fig = draw_ring_step(run, len(run.events) // 2)
    assert fig.axes[0].get_xlabel().startswith("shared-memory slot")
