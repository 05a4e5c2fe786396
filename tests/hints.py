"""What the exercise tests add to a failure: the usual mistake, when the error has its signature."""

import math


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
