"""The TensorFlowBackend class: its settings and identity; its work is in
the mixins beside it (storage, threads, control, whole runs, values, TFP's
methods)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from autobatch.backends.base import Backend
from autobatch.backends.tf.control import Control
from autobatch.backends.tf.runs import Runs
from autobatch.backends.tf.storage import Storage
from autobatch.backends.tf.support import (
    _TRACE_COUNTS,
    MODES,
    PHASE_MIN_BATCH,
    SELECTIONS,
)
from autobatch.backends.tf.tfp_methods import TensorFlowTfpMethods
from autobatch.backends.tf.threads import Threads
from autobatch.backends.tf.values import Values


class TensorFlowBackend(Storage, TensorFlowTfpMethods, Values, Threads, Control, Runs, Backend):
    """Runs autobatch programs on TensorFlow (see the module doc).

    Parameters
    ----------
    safety_checks : TFP's switch (default True): False drops the
        stack-overflow checks; an overflowing thread's result is then wrong
        and nothing says so.
    while_parallel_iterations : TFP's; accepted, not used (each iteration of
        autobatch's loop depends on the one before).
    while_maximum_iterations, basic_block_xla_device : TFP's; must be None
        (ValueError otherwise: autobatch bounds a run by ``max_stack_depth``
        and compiles with ``mode="xla"``).
    mode : keyword: ``"eager"``, ``"graph"`` (default) or ``"xla"``.  A
        string as the first positional argument is the mode too
        (``TensorFlowBackend("xla")``, autobatch's own spelling).
    selection : keyword: ``"gather"``, ``"mask"``, or for XLA ``"bucket"`` or
        ``"auto"``; default ``"auto"`` for XLA (buckets for the blocks that
        compute on or move per-thread vectors or matrices, masks for the
        others), else ``"gather"``.
    compile_blocks : keyword; eager mode only: run each block as one traced
        graph (default True) instead of op by op.

    The positional order is TFP's: ``TensorFlowBackend(safety_checks,
    while_parallel_iterations, while_maximum_iterations,
    basic_block_xla_device)``.

    Two backends with the same settings are equal (and hash alike), so
    compiled code cached for one is reused by the other.
    """

    name = "tensorflow"
    #: The value of type inference's placeholders (:meth:`placeholder`; weak
    #: Python scalars too): ones, as TFP's, since an integer ``a % b`` raises
    #: on a zero ``b`` here.
    placeholder_fill = 1
    #: TensorFlow refuses ``int64 < int32``: constants-only variables take
    #: their partner's dtype (see :class:`~autobatch.backends.base.Backend`).
    mixes_dtypes = False
    #: Type inference runs primops as TFP's does: on TensorFlow values (graph
    #: tensors in a graph) of a batch no per-thread dimension can be mistaken
    #: for (:func:`autobatch.type_inference.inference_batch`).
    inference_sees_a_batch = True
    #: XLA runs of programs of per-thread scalars over at least this many
    #: threads pack the running threads into a PHASE_DIVISOR-th of the batch
    #: once few enough run (:meth:`phase_sizes`).
    phase_min_batch = PHASE_MIN_BATCH

    def __init__(self, safety_checks: Any = True, while_parallel_iterations: int = 10,
                 while_maximum_iterations: Optional[int] = None,
                 basic_block_xla_device: Optional[str] = None, *, mode: str = "graph",
                 selection: Optional[str] = None, compile_blocks: bool = True) -> None:
        if isinstance(safety_checks, str):
            # autobatch's own spelling: TensorFlowBackend("xla") names the mode
            mode, safety_checks = safety_checks, True
        if not isinstance(while_parallel_iterations, int) or isinstance(
                while_parallel_iterations, bool):
            raise TypeError(
                f"TensorFlowBackend's second argument is TFP's while_parallel_iterations "
                f"(an int), got {while_parallel_iterations!r}; pass autobatch's settings by "
                f"keyword: TensorFlowBackend(mode=..., selection=..., compile_blocks=...)")
        if while_maximum_iterations is not None or basic_block_xla_device is not None:
            raise ValueError(
                "TensorFlowBackend: TFP's while_maximum_iterations and "
                "basic_block_xla_device are not supported (autobatch bounds a run by "
                "max_stack_depth, and compiles with mode='xla'); leave them None")
        #: TFP's ``while_parallel_iterations``: accepted, not used (each
        #: iteration of autobatch's loop depends on the one before).
        self.while_parallel_iterations = int(while_parallel_iterations)
        if mode not in MODES:
            raise ValueError(f"TensorFlowBackend mode must be one of {MODES}, got {mode!r}")
        if selection is None:
            selection = "auto" if mode == "xla" else "gather"
        if selection not in SELECTIONS:
            raise ValueError(f"TensorFlowBackend selection must be one of {SELECTIONS}, "
                             f"got {selection!r}")
        if mode == "xla" and selection == "gather":
            raise ValueError("XLA needs static shapes: use selection='mask' or 'bucket' "
                             "with mode='xla' (gathering the selected threads makes shapes "
                             "data-dependent)")
        if mode != "xla" and selection in ("bucket", "auto"):
            raise ValueError(f"selection={selection!r} needs mode='xla' (buckets rely on "
                             f"XLA dropping out-of-range scatter updates)")
        self.mode = mode
        self.selection = selection
        self.compile_blocks = bool(compile_blocks)
        #: TFP's switch: False drops the stack-overflow checks (a thread that
        #: overflows then computes garbage, unreported).
        self.safety_checks = bool(safety_checks)
        #: Storage is whole-batch and written under a mask or a bucket.
        self.masked = selection in ("mask", "bucket", "auto")
        #: While tracing one bucket's branch of a block: its size.
        self._bucket: Optional[int] = None
        self._variables = mode == "graph" and not self.masked
        #: Whether the graph being built may hold resource variables: False
        #: in a user's TF1 graph (no automatic control dependencies order the
        #: variable reads and writes) and under a user's XLA.
        self._variables_ok = True
        #: VM steps per pass of the graph's while loop, for programs whose
        #: values are all scalars per thread (see :meth:`_graph_run`).
        self.unroll = 2 if mode == "xla" else 1
        self._steps_per_pass = 1
        self._pending_checks: List[Any] = []
        self._final_error: Any = None
        #: id(stack variable) -> (the variable, its frames per thread).
        self._stack_frames: Dict[int, Tuple[Any, int]] = {}

    @property
    def trace_count(self) -> int:
        """How many times a whole program run was traced into a graph, by any
        backend equal to this one."""
        return _TRACE_COUNTS.get(self._config(), 0)

    # -- identity -------------------------------------------------------------------
    def _config(self) -> Tuple[Any, ...]:
        return (type(self), self.mode, self.selection, self.compile_blocks,
                self.safety_checks)

    def cache_key(self) -> Tuple[Any, ...]:
        return self._config()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TensorFlowBackend) and self._config() == other._config()

    def __hash__(self) -> int:
        return hash(self._config())

    def __repr__(self) -> str:
        return f"TensorFlowBackend(mode={self.mode!r}, selection={self.selection!r})"
