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

from ..analysis import FETCH_COPIES_GC_OFF, LEGACY_FETCH_COPIES_GC_OFF, RuntimeModel

__all__ = ["RuntimeFlags", "read_flags", "runtime_model", "GC_LAG_OPS", "GC_LAG_SECONDS",
           "LEGACY_GC_LAG_OPS",
           "WORKERS_CHECKED", "FETCH_CARRIED"]

#: How many ops late a free of a PIR program is taken to happen when frees
#: are counted in ops (:meth:`memopt.analysis.Analysis.total_peak_pending`;
#: level 2's executor modes use it).  Paddle 3.3.1's CPU garbage collector
#: queues every free on its own thread
#: (``InterpreterCoreEventGarbageCollector::Free``), so a buffer stays
#: allocated until that thread gets a core; no op or flag makes a CPU free
#: synchronous (docs/benchmarks.rst, "Synchronous frees").
GC_LAG_OPS = 4

#: How long Paddle's CPU collector thread is taken to stall when the peak of
#: a PIR step is figured (:attr:`memopt.analysis.RuntimeModel.late_free_seconds`,
#: GC on): the frees of the ops estimated to run within this time before an
#: op are still held when it allocates (at least the previous op's).  The
#: stall is a time, not a number of ops: a Transformer at batch 8 runs
#: hundreds of small ops in it, a CNN one or two convolutions.  Chosen so
#: that on ``benchmarks/bench_recompute.py --heldout``'s programs the modelled
#: peak is at least the 95th percentile of the measured step peaks on two
#: busy cores (docs/benchmarks.rst).
GC_LAG_SECONDS = 2.5e-3

#: How many ops late a legacy program's frees are taken to happen (GC on):
#: with frees at their op single steps of the legacy executor went over
#: their plans; one op late is what the unchanged programs' own largest
#: steps reach (``scripts/sweep_legacy_budget.py`` measures it).
LEGACY_GC_LAG_OPS = 1

#: Worker counts the dataflow schedule is also taken under
#: (:attr:`memopt.analysis.RuntimeModel.also_workers`): Paddle's executor
#: runs 4 threads, but on busy cores fewer run at once and its interleaving
#: lies between one thread's and four's.
WORKERS_CHECKED = (1, 2)

#: With the collector on, how many buffers the size of each fetched value
#: (not persistable) a PIR training loop holds beyond the value itself, at
#: every step after the first (:attr:`memopt.analysis.RuntimeModel.fetch_carried`):
#: Paddle 3.3.1's executor keeps the last step's fetch results, ``out =
#: exe.run(...)`` holds the previous step's arrays while the next runs, and
#: the fetch copy adds up to one more.  Fetch only the loss to leave them out.
FETCH_CARRIED = 3

GC_FLAG = "FLAGS_eager_delete_tensor_gb"
INPLACE_FLAG = "FLAGS_pir_apply_inplace_pass"
SEQUENTIAL_FLAG = "FLAGS_new_executor_sequential_run"
#: On: the executor runs a legacy program translated to PIR (the default
#: only while PIR is the static-mode IR; ``OldIrGuard`` and a process
#: started with ``FLAGS_enable_pir_api=0`` turn it off).
PIR_EXECUTOR_FLAG = "FLAGS_enable_pir_in_executor"


@dataclass(frozen=True)
class RuntimeFlags:
    """The flags as read: ``gc_value`` is ``FLAGS_eager_delete_tensor_gb``
    (GB; ``gc`` is ``gc_value >= 0``), ``inplace`` the PIR executor's
    in-place pass, ``pir_executor`` ``FLAGS_enable_pir_in_executor`` (a
    legacy program run now is translated to PIR first)."""

    gc_value: float = 0.0
    inplace: bool = True
    #: ``FLAGS_new_executor_sequential_run``: the executor runs the ops in
    #: program order on one thread (memopt's "program" schedule; measured:
    #: the allocator's peak is the program-order model's), not as their
    #: inputs become ready.
    sequential: bool = False
    #: ``FLAGS_enable_pir_in_executor``: a legacy program runs translated to PIR.
    pir_executor: bool = False

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

    flags = paddle.get_flags([GC_FLAG, INPLACE_FLAG, PIR_EXECUTOR_FLAG])
    try:
        sequential = bool(paddle.get_flags([SEQUENTIAL_FLAG])[SEQUENTIAL_FLAG])
    except Exception:  # pragma: no cover - a Paddle without the flag
        sequential = False
    return RuntimeFlags(float(flags[GC_FLAG]), bool(flags[INPLACE_FLAG]),
                        sequential=sequential,
                        pir_executor=bool(flags[PIR_EXECUTOR_FLAG]))


def runtime_model(ir: str = "pir", device: str = "cpu") -> RuntimeModel:
    """The :class:`RuntimeModel` Paddle's current flags select for a program
    of ``ir`` (Paddle's defaults when Paddle is not importable).

    A legacy program runs translated to PIR, but measured on Paddle 3.3.1 its
    ops are never made in-place (the peak does not move with
    ``FLAGS_pir_apply_inplace_pass``), so ``inplace`` is False for it.

    With ``FLAGS_new_executor_sequential_run`` the executor runs the ops in
    program order: the "program" schedule.  Measured (bench MLP, Paddle
    3.3.1 CPU, GC on): the step's peak is the program-order model's 8.58 MiB
    in most steps, where the dataflow model says 9.39 MiB.
    """
    try:
        flags = read_flags()
    except Exception:  # pragma: no cover - paddle missing or too old
        flags = RuntimeFlags()
    pir = ir == "pir"
    return RuntimeModel(gc=flags.gc, inplace=flags.inplace and pir, device=device,
                        fetch_copies=FETCH_COPIES_GC_OFF if pir else LEGACY_FETCH_COPIES_GC_OFF,
                        schedule="program" if flags.sequential else "dataflow",
                        late_frees=(0 if pir else LEGACY_GC_LAG_OPS) if flags.gc else 0,
                        late_free_seconds=GC_LAG_SECONDS if pir and flags.gc else 0.0,
                        also_workers=() if flags.sequential else WORKERS_CHECKED,
                        fetch_carried=FETCH_CARRIED if pir and flags.gc else 0,
                        next_feed=not flags.gc)
