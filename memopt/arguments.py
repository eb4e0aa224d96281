"""Reading the user's arguments that every entry point shares: bytes and batch sizes.

- :func:`as_bytes`: a memory amount (a budget) given as bytes (an int, or a
  float such as ``1.5e9``, rounded down to whole bytes) or as a string such
  as ``"6GiB"`` / ``"512MB"`` (:func:`memopt.report.parse_bytes`): wherever
  memopt takes bytes it takes these strings too.
- :func:`as_batch`: a batch size, a positive int (NumPy integers too; a
  bool, a float such as ``64.0`` or a string is refused).

Wrong types raise :class:`memopt.errors.ArgumentTypeError` (a TypeError),
wrong values ValueError; each message names the argument and the value.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ArgumentTypeError
from .report import parse_bytes

__all__ = ["as_bytes", "as_batch"]


def as_bytes(value, argument: str = "budget", allow_zero: bool = False) -> int:
    """``value`` in bytes (see the module docstring).

    Raises
    ------
    ArgumentTypeError : not an int, float or string (a bool is not bytes).
    ValueError : a string that is no amount of bytes, a float that is not
        finite, or a value below 1 (below 0 with ``allow_zero``).
    """
    numeric = (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numeric + (str,)):
        raise ArgumentTypeError(
            f"{argument} must be bytes (an int such as 8388608) or a string such as "
            f"'8MiB' or '6GiB', got {value!r} ({type(value).__name__})")
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        raise ValueError(f"{argument} must be a finite number of bytes, got {value!r}")
    try:
        nbytes = parse_bytes(value) if isinstance(value, str) else int(value)
    except ValueError as exc:
        raise ValueError(f"{argument}: {exc}") from None
    if nbytes < 0 or (nbytes == 0 and not allow_zero):
        raise ValueError(f"{argument} must be {'>= 0' if allow_zero else 'positive'} bytes, "
                         f"got {value!r}")
    return nbytes


def as_batch(value, argument: str = "batch_size") -> int:
    """``value`` as a batch size: a positive int.

    Raises
    ------
    ArgumentTypeError : not an int (a float such as ``64.0``, a string, a bool).
    ValueError : an int below 1.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        hint = (f" (write {int(value)})" if isinstance(value, (float, np.floating))
                and math.isfinite(value) and float(value).is_integer() else "")
        raise ArgumentTypeError(
            f"{argument} must be an int, the number of rows of a step's -1 (batch) "
            f"dimension, got {value!r} ({type(value).__name__}){hint}")
    if value < 1:
        raise ValueError(f"{argument} must be a positive int, got {value!r}")
    return int(value)
