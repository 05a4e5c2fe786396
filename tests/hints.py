"""What the exercise tests add to a failure: the usual mistake, when the error has its signature."""

import math

import torch

# what the exercise tests' torch.empty, empty_like and empty_strided fill new floating tensors with (root
# conftest.py's `exercise` fixture): exact in fp16, bf16 and fp32, and far from anything the exercises compute
UNWRITTEN = -4096.0


def known_mistake(err: float, signatures) -> str:
    """``"\\nhint: …"`` for the first ``(expected error, hint)`` whose expected relative error is
    within 1% of ``err`` (a mistake such as a flipped sign or a missing scale gives an exact
    error, whatever the inputs), else ``""``."""
    for expected, hint in signatures:
        if math.isfinite(err) and abs(err - expected) <= 0.01 * expected:
            return f"\nhint: {hint}"
    return ""


def require(condition, message: str) -> None:
    """``assert condition, message`` without pytest's rewriting: the message alone, not the message
    followed by the tensors of ``torch.isfinite(out).all()`` printed in full."""
    if not bool(condition):
        raise AssertionError(message)


def unwritten(t: torch.Tensor, what: str) -> str:
    """``"\\nhint: …"`` when entries of ``t`` still hold `UNWRITTEN`, the value the tests' ``torch.empty``
    gave the tensor: the kernel never stored there. Else ``""``."""
    if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()):
        return ""
    left = int((t == UNWRITTEN).sum())
    if not left:
        return ""
    held = f"{UNWRITTEN:g}, the value the tests fill new tensors from torch.empty with"
    if left == t.numel():
        return (f"\nhint: the kernel wrote nothing to {what}: every entry still holds {held}. Is the kernel's "
                f"body written (not `pass`), and does its tl.store write {what}?")
    return (f"\nhint: the kernel left {left} of the {t.numel()} entries of {what} unwritten: they still hold {held}. "
            "The grid, the offsets or the store's mask miss some.")
