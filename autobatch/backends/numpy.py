"""The NumPy backend: compact selections, in-place storage.

A selection is the array of indices of the selected threads
(``np.flatnonzero(pc == block)``), so reading a variable gathers only those
rows and a primop does work proportional to the number of threads that run
it.  Storage arrays are updated in place.  Stack operations index a
``[frames, batch, ...]`` array with one frame index per thread
(``stack[frame, idx]``): O(selected threads) per push or pop, never
O(batch^2).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np

from autobatch.backends.base import Backend
from autobatch.ir import TensorType, numpy_type_of

__all__ = ["NumpyBackend", "MaskedNumpyBackend"]


class NumpyBackend(Backend):
    """Runs autobatch programs eagerly on NumPy arrays."""

    name = "numpy"
    #: Call-free programs run as one fused loop (:mod:`autobatch.fused`).
    fused_loops = True

    def __init__(self, native: Optional[bool] = None) -> None:
        """``native``: run programs on the native engine (:mod:`autobatch.native`,
        compiled by numba, one thread per lane) -- None (default): where numba
        imports, ``AUTOBATCH_NATIVE`` is not ``0`` and every primop and
        variable lowers, else the fused loop or the VM as before; True:
        always (:class:`~autobatch.errors.NativeEngineError` where it
        cannot); False: never."""
        if native not in (None, True, False):
            raise ValueError(f"NumpyBackend(native=...) takes None (automatic), True or "
                             f"False, got {native!r}")
        self.native = native

    def cache_key(self) -> Tuple[Any, ...]:
        return (type(self), self.native)

    # -- storage ------------------------------------------------------------------
    def fill(self, tensor_type: TensorType, batch_size: int, value: Any = 0) -> np.ndarray:
        return np.full((batch_size,) + tensor_type.shape, value, dtype=tensor_type.dtype)

    def stack(self, tensor_type: TensorType, batch_size: int, frames: int,
              value: Any = 0) -> np.ndarray:
        return np.full((frames, batch_size) + tensor_type.shape, value,
                       dtype=tensor_type.dtype)

    def size(self, array: np.ndarray) -> int:
        return int(array.shape[0])

    def as_batched(self, value: Any, tensor_type: TensorType, batch_size: int) -> np.ndarray:
        array = np.asarray(value)
        if array.ndim == len(tensor_type.shape):
            array = array[None]
        out = np.empty((batch_size,) + tensor_type.shape, dtype=tensor_type.dtype)
        out[...] = array  # broadcasts a batch of 1; copies (never aliases value)
        return out

    def to_numpy(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    # -- types -----------------------------------------------------------------------
    def type_of(self, value: Any, batch_size: int) -> TensorType:
        return numpy_type_of(value, batch_size)

    def placeholder(self, tensor_type: TensorType, batch_size: int) -> np.ndarray:
        return np.zeros((batch_size,) + tensor_type.shape, dtype=tensor_type.dtype)

    def merge_dtypes(self, dt1: Any, dt2: Any) -> Any:
        """As TFP's NumPy backend: the promoted dtype (int32 and int64 give
        int64)."""
        if dt1 is None or dt2 is None:
            return dt1 if dt2 is None else dt2
        return np.promote_types(dt1, dt2)

    # -- threads -------------------------------------------------------------------------
    def select(self, pc: np.ndarray, block: int) -> np.ndarray:
        return (pc == block).nonzero()[0]

    def read(self, array: np.ndarray, selection: np.ndarray) -> np.ndarray:
        # ``take`` gathers the same rows as ``array[selection]``, faster
        return array.take(selection, axis=0)

    def write(self, array: np.ndarray, selection: np.ndarray, value: Any) -> np.ndarray:
        array[selection] = value
        return array

    def read_frame(self, stack: np.ndarray, selection: np.ndarray, frame: Any) -> np.ndarray:
        return stack[frame, selection]

    def write_frame(self, stack: np.ndarray, selection: np.ndarray, frame: Any,
                    value: Any) -> np.ndarray:
        stack[frame, selection] = value
        return stack

    def where(self, condition: Any, x: Any, y: Any, name: Any = None) -> Any:
        return np.where(condition, x, y)

    def split(self, selection: np.ndarray, cond: Any) -> Tuple[np.ndarray, ...]:
        """``(selection, positions where cond holds, positions where not)``;
        integer positions index faster than boolean masks."""
        mask = np.broadcast_to(np.asarray(cond, dtype=bool), selection.shape)
        return selection, mask.nonzero()[0], (~mask).nonzero()[0]

    def part(self, split: Tuple[np.ndarray, ...], side: bool) -> np.ndarray:
        return split[0][split[1] if side else split[2]]

    def narrow(self, value: Any, split: Tuple[np.ndarray, ...], side: bool) -> Any:
        if np.ndim(value) == 0:
            return value
        return value[split[1] if side else split[2]]

    def merge(self, split: Tuple[np.ndarray, ...], if_true: Any, if_false: Any,
              tensor_type: TensorType) -> np.ndarray:
        out = np.empty(split[0].shape + tensor_type.shape, dtype=tensor_type.dtype)
        out[split[1]] = if_true
        out[split[2]] = if_false
        return out

    def callee_pc(self, selection: np.ndarray, entry: int, halt: int) -> np.ndarray:
        return np.full(selection.shape[0], entry, dtype=np.int32)

    # -- compaction (optional protocol) ----------------------------------------------------
    #: The VM may drop halted threads from every array (shapes change).
    compaction = True

    def running_threads(self, pc: np.ndarray, halt: int) -> Tuple[np.ndarray, int]:
        running = (pc < halt).nonzero()[0]
        return running, int(running.shape[0])

    def take_threads(self, array: np.ndarray, selection: np.ndarray, axis: int) -> np.ndarray:
        return np.take(array, selection, axis=axis)

    # -- control -------------------------------------------------------------------------
    def reduce_min(self, t: np.ndarray, name: Any = None) -> int:
        return int(t.min())

    def check(self, ok: Any, selection: np.ndarray,
              make_error: Callable[[], Exception]) -> None:
        if not ok.all():
            raise make_error()


class MaskedNumpyBackend(NumpyBackend):
    """Whole-batch selections: a boolean mask, values for every thread.

    Reads return whole arrays, writes are ``np.where`` on the mask and return
    new arrays, stack writes copy the stack: the functional, fixed-shape
    semantics of a TensorFlow or XLA backend, here in NumPy so that the
    executors are tested against both kinds of backend.  Slower than
    :class:`NumpyBackend`; not meant for speed.
    """

    name = "numpy-masked"
    compaction = False  # fixed shapes, as under XLA
    fused_loops = False  # runs every program on the VM, as a TensorFlow backend does

    def __init__(self, native: Optional[bool] = False) -> None:
        """As :class:`NumpyBackend`, but the native engine is off by default
        (this backend exists to run the VM with masks)."""
        super().__init__(native)

    @staticmethod
    def _rows(mask: np.ndarray, ndim: int) -> np.ndarray:
        return mask.reshape(mask.shape + (1,) * (ndim - 1))

    def select(self, pc: np.ndarray, block: int) -> np.ndarray:
        return pc == block

    def read(self, array: np.ndarray, selection: np.ndarray) -> np.ndarray:
        return array

    def write(self, array: np.ndarray, selection: np.ndarray, value: Any) -> np.ndarray:
        value = np.asarray(value, dtype=array.dtype)
        return np.where(self._rows(selection, array.ndim), value, array)

    def read_frame(self, stack: np.ndarray, selection: np.ndarray, frame: Any) -> np.ndarray:
        frame = np.clip(frame, 0, stack.shape[0] - 1)
        return stack[frame, np.arange(stack.shape[1])]

    def write_frame(self, stack: np.ndarray, selection: np.ndarray, frame: Any,
                    value: Any) -> np.ndarray:
        frame = np.clip(frame, 0, stack.shape[0] - 1)
        threads = np.arange(stack.shape[1])
        old = stack[frame, threads]
        new = stack.copy()
        new[frame, threads] = self.write(old, selection, value)
        return new

    def split(self, selection: np.ndarray, cond: Any) -> Tuple[np.ndarray, np.ndarray]:
        return selection, np.asarray(cond, dtype=bool)

    def part(self, split: Tuple[np.ndarray, np.ndarray], side: bool) -> np.ndarray:
        return split[0] & (split[1] if side else ~split[1])

    def narrow(self, value: Any, split: Tuple[np.ndarray, np.ndarray], side: bool) -> Any:
        return value

    def merge(self, split: Tuple[np.ndarray, np.ndarray], if_true: Any, if_false: Any,
              tensor_type: TensorType) -> np.ndarray:
        cond = split[1]
        cond = cond.reshape(cond.shape + (1,) * (len(tensor_type.shape) if cond.ndim else 0))
        return np.where(cond, if_true, if_false).astype(tensor_type.dtype)

    def callee_pc(self, selection: np.ndarray, entry: int, halt: int) -> np.ndarray:
        return np.where(selection, entry, halt).astype(np.int32)

    def check(self, ok: Any, selection: np.ndarray,
              make_error: Callable[[], Exception]) -> None:
        if not np.all(np.asarray(ok) | ~selection):
            raise make_error()

    def wrap_block(self, function: Callable[[dict], dict], name: str) -> Callable[[dict], dict]:
        """Primops also see threads outside the selection (stale values, maybe
        zeros): silence NumPy's floating-point warnings about them."""
        def block(state: dict) -> dict:
            with np.errstate(all="ignore"):
                return function(state)
        block.__name__ = getattr(function, "__name__", "block")
        return block
