"""The TensorFlow backend: the batched VM eagerly, in ``tf.function``, or with XLA.

Modes (``TensorFlowBackend(mode=...)``):

- ``"eager"``: the VM's loop runs in Python, one block per step.  Each
  block's code is traced once into a graph (kept in the
  ``block_code_cache``) and called with the state's tensors, so a step is one
  graph call, not a dozen eager ops; ``compile_blocks=False`` runs every op
  eagerly instead.
- ``"graph"``: the whole run (every step, every block) is one
  ``tf.function``: ``tf.while_loop`` around ``tf.switch_case`` over the
  blocks, the chosen block called as a function.  Traced once per program
  and argument signature.
- ``"xla"``: the same function with ``jit_compile=True``.

Selections: ``"gather"`` (the default for eager and graph) selects the
threads at a block with ``tf.where`` and gathers/scatters their rows, so
primops see only those threads (work proportional to them; dynamic shapes).
XLA needs static shapes.  ``"mask"`` computes every block on every thread
and keeps the selected rows with ``tf.where``: primops then also see threads
outside the selection (stale values), as the backend protocol allows.
``"bucket"`` packs the selected threads into the smaller of two static
sizes (a quarter of the batch, the whole batch: :func:`bucket_sizes`) and
runs the block on those rows only, each block compiled once per size;
padding slots hold stale rows too, and their writes are dropped.
``"auto"`` (the XLA default) buckets the blocks that compute on or move
(push, pop, copy) per-thread vectors or matrices (NUTS-shaped: 4-5x faster
than masks) and masks the others (on scalars, as in fib, packing costs more
than the few operations it saves, and each bucket is one more compiled copy
of the block).

Storage: stacks are thread-major, ``[batch, frames, ...]``: a push or pop is
one gather or scatter of one row per selected thread.  In graph mode with
gathering, every register and stack (held flat, ``[batch * frames, ...]``) is
an anonymous resource variable updated in place (TensorFlow's executor would copy a whole tensor per scatter: a push
would cost the whole stack); the while loop captures the variables rather
than carrying them.  XLA keeps tensors (it updates loop buffers in place) and
runs two VM steps per loop pass for programs of per-thread scalars; on large
batches of those, once at most an eighth of the threads still run, it packs
them into arrays of an eighth of the size and goes on there (fib over
10,000 threads: 2.1x faster steady, about 3 s more compile).

Stack overflow: where the VM runs inside a graph, the depth check cannot
raise; the failing check's code is kept in the loop state, the loop stops, and
:meth:`TensorFlowBackend.run_vm` raises the engine's StackOverflowError after
the run.  Eagerly, the check raises at once.

Results are ``tf.Tensor`` s (EagerTensors outside a graph); ``.numpy()``
gives arrays.  Inside a user's own ``tf.function`` the VM builds graph ops
(``tf.while_loop``, ``tf.switch_case``) whatever the mode.

Not thread-safe: a backend object traces one program at a time.
"""
from autobatch.backends.tf.backend import TensorFlowBackend
from autobatch.backends.tf.selections import BUCKET_DIVISORS, bucket_sizes
from autobatch.backends.tf.support import (
                                           ERROR_KEY,
                                           MODES,
                                           PHASE_DIVISOR,
                                           PHASE_MIN_BATCH,
                                           SELECTIONS,
                                           SPARE_FRAMES,
                                           raise_for_error_code,
)

__all__ = ["TensorFlowBackend", "MODES", "SELECTIONS", "BUCKET_DIVISORS", "bucket_sizes",
           "ERROR_KEY", "PHASE_DIVISOR", "PHASE_MIN_BATCH", "SPARE_FRAMES",
           "raise_for_error_code"]
