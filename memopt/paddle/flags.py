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

#: How many ops late a free of a PIR program is taken to happen
#: (:attr:`memopt.analysis.RuntimeModel.late_frees`, GC on).  Paddle 3.3.1's
#: CPU garbage collector queues every free on its own thread
#: (``InterpreterCoreEventGarbageCollector::Free``), so a buffer stays
#: allocated until that thread gets a core; no op or flag makes a CPU free
#: synchronous (docs/benchmarks.rst, "Synchronous frees").  Measured here (2
#: shared cores, load 4-5): the allocator's step peak exceeded the steady
#: one in 15-50% of steps, by up to 1.21x on U-Net (a 4-op lag models
#: 1.25x), 1.07x on DenseNet and 1.38x on BERT (4 ops: 1.28x), with rare
#: outliers beyond any lag.
GC_LAG_OPS = 4

#: How long Paddle's CPU collector thread is taken to stall when the peak of
#: a PIR step is figured (:attr:`memopt.analysis.RuntimeModel.late_free_seconds`,
#: GC on): the frees of the ops estimated to finish within this time before
#: an op are still held when it allocates (at least the previous op's).
#: The stall is a time, not a number of ops: a Transformer at batch 8 runs
#: hundreds of ~50 us ops, a CNN a few ms-long convolutions.  Measured
#: (``benchmarks/bench_recompute.py --heldout``'s programs, 8 fresh
#: processes x 10 steps each, default flags, 2 cores at load 5-10): the 95th
#: percentile of the step peaks over the peak with frees on time was 1.214
#: (BERT-style, batch 8), 1.035 (batch 32), 1.178 / 1.037 (GPT-style, 8 /
#: 32), 1.153 (U-Net, 4); with 2.5 ms (1, 2 and 4 threads) the model gives
#: 1.26, 1.06, 1.36, 1.13, 1.28, where 4 ops gave 1.13, 1.15, 1.19, 1.21,
#: 1.39 and a small CNN (batch 64, measured ~1.0) 1.74 against 1.26 now.
GC_LAG_SECONDS = 2.5e-3

#: How many ops late a legacy program's frees are taken to happen (GC on).
#: Measured 2026-11-26 (``scripts/sweep_legacy_budget.py --steps 6``, 2
#: shared cores, fresh processes; CNN with batch_norm at batch 32 64x64, the
#: ``ffn_dropout`` stack at batch 1024 width 256, VGG at batch 32 64x64):
#: frees at their op gave plans whose single steps went over the budget
#: (the largest of 6 steps 1.08x, 1.44x on the CNN at 80%, 1.17x VGG at
#: 80%); with frees 1 op late the model gives what those spikes reach (the
#: unchanged CNN 22.3 MiB modelled, 18.99-23.0 MiB measured as its largest
#: step in different runs; VGG 46.6 against 43.1-44.1).
LEGACY_GC_LAG_OPS = 1

#: Worker counts the dataflow schedule is also taken under
#: (:attr:`memopt.analysis.RuntimeModel.also_workers`).  Paddle's executor
#: runs 4 threads, but on busy cores fewer run at once and its interleaving
#: lies between one thread's and four's (a BERT plan modelled at 7.8 MB
#: with 4 workers ran at 8.5-10.7 MB on 2 loaded cores; 1 and 2 workers
#: give 8.1 and 7.8 MB, and with frees 4 ops late 11.8 and 10.9 MB).
WORKERS_CHECKED = (1, 2)

#: With the collector on, how many buffers the size of each fetched value
#: (not persistable) a PIR training loop holds beyond the value itself, at
#: every step after the first (:attr:`memopt.analysis.RuntimeModel.fetch_carried`):
#: Paddle 3.3.1's executor keeps the last step's fetch results, ``out =
#: exe.run(...)`` holds the previous step's arrays while the next runs, and
#: the fetch copy adds up to one more.  Measured (GC on, fetch_list [loss,
#: logits]) every later step is the first plus two of each fetched value, the
#: first at most one above the prediction: tied LSTM LM (logits 8.19 MB)
#: 36.39 / 52.78 / 29.74 MB (step 1 / steps 2-4 / predicted), GPT-6 (2.05 MB)
#: 55.75 / 59.84 / 54.47.  Fetch only the loss to leave them out.
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
