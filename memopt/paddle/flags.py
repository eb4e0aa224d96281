"""Paddle's memory flags, read once into plain data (the one reader).

``FLAGS_eager_delete_tensor_gb`` (>= 0: the eager-deletion garbage collector
frees each variable after its last use; < 0: nothing is freed during a run)
and ``FLAGS_pir_apply_inplace_pass`` (the PIR executor runs some ops in
place) decide how Paddle's executor handles memory.  :func:`read_flags`
reads them; :func:`runtime_model` turns them into the core's
:class:`memopt.analysis.RuntimeModel`; :attr:`RuntimeFlags.gc_text` /
:attr:`RuntimeFlags.pir_text` are the ``Report.runtime`` lines.

Paddle is imported inside the functions.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..analysis import RuntimeModel

__all__ = ["RuntimeFlags", "read_flags", "runtime_model"]

GC_FLAG = "FLAGS_eager_delete_tensor_gb"
INPLACE_FLAG = "FLAGS_pir_apply_inplace_pass"
SEQUENTIAL_FLAG = "FLAGS_new_executor_sequential_run"


@dataclass(frozen=True)
class RuntimeFlags:
    """The flags as read: ``gc_value`` is ``FLAGS_eager_delete_tensor_gb``
    (GB; ``gc`` is ``gc_value >= 0``), ``inplace`` the PIR executor's
    in-place pass."""

    gc_value: float = 0.0
    inplace: bool = True
    #: ``FLAGS_new_executor_sequential_run``: the executor runs the ops in
    #: program order (measured: the allocator's peak is the program-order
    #: model's), not as their inputs become ready
    sequential: bool = False

    @property
    def gc(self) -> bool:
        return self.gc_value >= 0

    @property
    def gc_text(self) -> str:
        """``"garbage collection on (FLAGS_eager_delete_tensor_gb=0)"``."""
        return f"garbage collection {'on' if self.gc else 'off'} ({GC_FLAG}={self.gc_value:g})"

    @property
    def pir_text(self) -> str:
        """The GC line plus the executor's in-place pass."""
        return (f"{self.gc_text}, executor in-place pass {'on' if self.inplace else 'off'} "
                f"({INPLACE_FLAG})")


def read_flags() -> RuntimeFlags:
    """The current values of Paddle's memory flags."""
    import paddle

    flags = paddle.get_flags([GC_FLAG, INPLACE_FLAG])
    try:
        sequential = bool(paddle.get_flags([SEQUENTIAL_FLAG])[SEQUENTIAL_FLAG])
    except Exception:  # pragma: no cover - a Paddle without the flag
        sequential = False
    return RuntimeFlags(float(flags[GC_FLAG]), bool(flags[INPLACE_FLAG]), sequential)


def runtime_model(ir: str = "pir", device: str = "cpu") -> RuntimeModel:
    """The :class:`RuntimeModel` Paddle's current flags select for a program
    of ``ir`` (Paddle's defaults when Paddle is not importable).

    A legacy program runs translated to PIR, but measured on Paddle 3.3.1 its
    ops are never made in-place (the peak does not move with
    ``FLAGS_pir_apply_inplace_pass``), so ``inplace`` is False for it.
    """
    try:
        flags = read_flags()
    except Exception:  # pragma: no cover - paddle missing or too old
        flags = RuntimeFlags()
    return RuntimeModel(gc=flags.gc, inplace=flags.inplace and ir == "pir", device=device,
                        schedule="program" if flags.sequential else "dataflow")
