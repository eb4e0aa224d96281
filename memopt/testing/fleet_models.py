"""Distributed training programs as ``paddle.distributed.fleet`` builds them.

For tests, ``benchmarks/bench_distributed.py`` and the README.  An MLP regression
model (``layers`` fully connected layers of ``hidden`` units, ReLU, mean
squared error, Momentum) is built in the legacy IR and handed to
``fleet.distributed_optimizer(...).minimize``, which rewrites it for one rank
of ``nranks``:

``"single"``  no fleet: the one-device program (the estimate's input).
``"dp"``      collective data parallel (fleet's RawProgramOptimizer, one
              ``all_reduce`` per gradient, ``fuse_all_reduce_ops=False``).
``"dp_fused"`` data parallel with fused gradients (``coalesce_tensor`` +
              one ``all_reduce`` + ``depend``).
``"gm"``      data parallel with gradient merge (``k_steps=2``).
``"sharding1"`` / ``"sharding2"``  fleet's sharding meta optimizer with
              ``sharding_configs["stage"]`` 1/2 (it writes ``main_sharding_N``
              / ``start_sharding_N`` text files into the current directory).
              Paddle 3.3.1's static sharding has no stage setting: both
              build the same program (optimizer state sharded, parameters
              broadcast from their owners, gradients reduced to them).

What Paddle 3.3.1 on a CPU build does with them (measured here, gloo):

- fleet writes the communicator set-up into the startup program and refuses a
  CPU build: ``ValueError: comm_id must be generated in paddlepaddle-xpu or
  paddlepaddle-xpu.`` (``CollectiveHelper._init_communicator``).  The gloo
  communicator comes from ``paddle.distributed.init_parallel_env()`` instead,
  so :func:`build` skips that set-up while fleet runs (and the parameter
  broadcast that follows it: both ranks start from the same seed);
  the main program is fleet's own, unchanged.
- The legacy executor has no CPU kernel path for the new collective ops
  (``all_reduce``, ``broadcast``, ``reduce``...: ``NotFoundError: interface
  not found`` from ``device_manager.cc``), and ``c_allreduce_sum``,
  ``c_broadcast``, ``c_reduce_sum``, ``c_allgather``, ``c_reducescatter`` are
  not registered (``Operator "c_allreduce_sum" has not been registered``).
  Run with ``FLAGS_enable_pir_in_executor=1`` the program is translated to
  PIR, whose ``pd_op.all_reduce_`` / ``pd_op.broadcast_`` run on gloo.
- Still failing in PIR: ``c_sync_calc_stream`` (``PreconditionNotMet: op
  [pd_op.sync_calc_stream_] kernel output args (0) defs should equal op
  outputs (1)``: gradient merge and sharding), ``c_sync_comm_stream``
  (``NotFound: The kernel `sync_comm_stream` is not registered``), ``depend``
  (``Op depend should have corresponding OpInfo pd_op.depend_``: fused data
  parallel), ``send_v2``/``recv_v2`` (``Do not support send for cpu kernel
  now``: pipeline parallel).  :func:`strip_stream_syncs` removes the two
  stream-sync ops, which order a GPU's streams and have nothing to wait for
  on a CPU with gloo (its collectives return when done), so the sharding and
  gradient-merge programs can run here.
"""
from __future__ import annotations

import contextlib
import os

MODES = ("single", "dp", "dp_fused", "gm", "sharding1", "sharding2")
STREAM_SYNC_OPS = ("c_sync_calc_stream", "c_sync_comm_stream")


def set_rank_env(rank: int, nranks: int, base_port: int = 36170) -> None:
    """The environment fleet reads to know its rank (what
    ``paddle.distributed.spawn`` / ``launch`` set); for building a rank's
    program in a process no launcher started.  Values already set are kept."""
    endpoints = ",".join(f"127.0.0.1:{base_port + i}" for i in range(nranks))
    defaults = {
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(nranks),
        "PADDLE_TRAINER_ENDPOINTS": endpoints,
        "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{base_port + rank}",
        "PADDLE_RANK_IN_NODE": str(rank),
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


@contextlib.contextmanager
def _no_communicator_setup():
    """Skip fleet's startup-program communicator set-up (CPU builds refuse it)."""
    from paddle.distributed.fleet.meta_optimizers import common, raw_program_optimizer

    saved = (common.CollectiveHelper._init_communicator,
             raw_program_optimizer.RawProgramOptimizer._init_process_group)
    common.CollectiveHelper._init_communicator = lambda self, *a, **k: None
    raw_program_optimizer.RawProgramOptimizer._init_process_group = lambda self: None
    try:
        yield
    finally:
        (common.CollectiveHelper._init_communicator,
         raw_program_optimizer.RawProgramOptimizer._init_process_group) = saved


def _strategy(mode: str, nranks: int):
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    if mode == "dp":
        strategy.fuse_all_reduce_ops = False
    elif mode == "gm":
        strategy.fuse_all_reduce_ops = False
        strategy.gradient_merge = True
        strategy.gradient_merge_configs = {"k_steps": 2, "avg": True}
    elif mode.startswith("sharding"):
        strategy.sharding = True
        strategy.sharding_configs = {"sharding_degree": nranks, "stage": int(mode[-1])}
    return strategy


def build(mode: str = "dp", *, nranks: int = 2, features: int = 64, hidden: int = 256,
          layers: int = 3, seed: int = 7):
    """``(main, startup, loss)`` of one rank's legacy training program.

    Call in static mode with ``FLAGS_enable_pir_api=0``.  For modes other
    than ``"single"`` fleet is initialised (collective) from the rank
    environment (:func:`set_rank_env` when no launcher set it).  Feeds: ``x``
    ``[-1, features]`` and ``y`` ``[-1, 1]`` float32.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    import paddle

    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = seed
    strategy = None
    if mode != "single":
        from paddle.distributed import fleet

        strategy = _strategy(mode, nranks)
        fleet.init(is_collective=True, strategy=strategy)
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [-1, features], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        h = x
        for _ in range(layers):
            h = paddle.static.nn.fc(h, hidden, activation="relu")
        out = paddle.static.nn.fc(h, 1)
        loss = paddle.mean((out - y) ** 2)
        opt = paddle.optimizer.Momentum(0.01, momentum=0.9)
        if mode == "single":
            opt.minimize(loss)
        else:
            from paddle.distributed import fleet

            with _no_communicator_setup():
                fleet.distributed_optimizer(opt, strategy).minimize(loss)
    return main, startup, loss


def strip_stream_syncs(program) -> int:
    """Remove ``c_sync_calc_stream`` / ``c_sync_comm_stream`` ops from every
    block of a legacy program (they have no CPU kernel in Paddle 3.3.1 and
    nothing to wait for with gloo); returns how many were removed."""
    removed = 0
    for block in program.blocks:
        for index in reversed(range(len(block.ops))):
            if block.ops[index].type in STREAM_SYNC_OPS:
                block._remove_op(index)
                removed += 1
    program._sync_with_cpp()
    return removed


def one_ring(program) -> int:
    """Put every collective of ``program`` on ring 0; returns how many moved.

    fleet's sharding talks on ring 1 (the sharding group); the gloo group
    ``init_parallel_env`` makes is ring 0 only, and the static ops find no
    other (``UnavailableError: NCCLCommContext is nullptr, collective op
    should has ring_id attr``, broadcast_kernel.cc:40; a second
    ``dist.new_group`` does not register ring 1 for them).  With the sharding
    degree equal to the number of ranks both rings hold the same ranks.
    """
    moved = 0
    for block in program.blocks:
        for op in block.ops:
            if op.has_attr("ring_id") and op.attr("ring_id") != 0:
                op._set_attr("ring_id", 0)
                moved += 1
    return moved


def feed(rank: int, step: int, batch: int, features: int = 64) -> dict:
    """The rank's deterministic batch for ``step``."""
    import numpy as np

    rng = np.random.RandomState(1000 * rank + step)
    return {"x": rng.rand(batch, features).astype("float32"),
            "y": rng.rand(batch, 1).astype("float32")}


def parameters(program, scope=None) -> list:
    """``[(name, ndarray)]`` of the program's persistable variables after a
    run, sorted by name (parameters and optimizer state)."""
    import numpy as np
    import paddle

    scope = scope or paddle.static.global_scope()
    out = []
    for var in sorted(program.list_vars(), key=lambda v: v.name):
        if not var.persistable:
            continue
        found = scope.find_var(var.name)
        if found is None:
            continue
        try:
            tensor = found.get_tensor()
            if not tensor._is_initialized():
                continue
            out.append((var.name, np.array(tensor)))
        except Exception:  # not a dense tensor (a RAW comm id, a reader)
            continue
    return out


def build_pir_dp(*, nranks: int = 2, features: int = 16, hidden: int = 32, seed: int = 7):
    """``(main, startup, loss)``: a plain PIR data-parallel training program
    (no fleet, no auto-parallel): the MLP, ``append_backward``, then
    ``paddle.distributed.all_reduce`` on every gradient (``pd_op.all_reduce_``,
    in place, ring 0: ``init_parallel_env``'s gloo group), scaled by
    ``1 / nranks``, and SGD.  Call in static mode under PIR (the default),
    after ``init_parallel_env``.  Feeds as :func:`build`'s."""
    import paddle
    import paddle.distributed as dist

    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = seed
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [-1, features], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        h = paddle.nn.functional.relu(paddle.static.nn.fc(x, hidden))
        loss = paddle.mean((paddle.static.nn.fc(h, 1) - y) ** 2)
        averaged = []
        for param, grad in paddle.static.append_backward(loss):
            dist.all_reduce(grad)
            averaged.append((param, paddle.scale(grad, 1.0 / nranks)))
        paddle.optimizer.SGD(0.01).apply_gradients(averaged)
    return main, startup, loss
