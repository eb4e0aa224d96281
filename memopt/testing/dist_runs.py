"""Two-rank runs of fleet training programs (for the bench and the tests).

Runs one rank of a fleet training program, as ``paddle.distributed.spawn``
starts it, and records what memopt's distributed claims are checked on.
A face (like :mod:`memopt.testing.models`): it calls the API.

:func:`run_rank` is the function each spawned rank runs (gloo backend, CPU):
it builds the rank's program (:mod:`memopt.testing.fleet_models`), optionally
rewrites it with ``memory_optimize`` (and ``release_memory``), predicts the
rank's peak with ``memopt.estimate`` before running anything, runs the startup
program and ``steps`` training steps, and writes a ``.npz`` per rank: the
losses, every persistable variable after the run, the allocator's peak
(``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)``) and the
estimate.  Used by ``benchmarks/bench_distributed.py`` and the tests.

:func:`launch_auto_parallel` / :func:`run_auto_parallel_rank` do the same
for auto-parallel PIR programs (``paddle.distributed.to_static``,
:mod:`memopt.testing.auto_parallel_models`) and a plain PIR data-parallel
program (:func:`memopt.testing.fleet_models.build_pir_dp`): ``memory_optimize``
is applied to the rank's PIR program after Paddle's parallel passes.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, asdict
from typing import Optional


@dataclass(frozen=True)
class RunConfig:
    """One configuration of a two-rank run.

    mode : a :data:`memopt.testing.fleet_models.MODES` entry.
    level : None (unoptimized) or memory_optimize's level (0 or 1).
    release : also ``release_memory`` (GC off only).
    gc : Paddle's eager-deletion GC on (``FLAGS_eager_delete_tensor_gb=0``)
        or off (-1).
    batch : samples per rank per step.
    steps : training steps.
    """

    mode: str = "dp"
    level: Optional[int] = None
    release: bool = False
    gc: bool = True
    batch: int = 64
    steps: int = 3
    features: int = 256
    hidden: int = 512
    layers: int = 3

    @property
    def label(self) -> str:
        opt = "unoptimized" if self.level is None else f"L{self.level}"
        if self.release:
            opt += " + release"
        shape = "" if (self.features, self.hidden, self.layers) == (256, 512, 3) else \
            f" [MLP {self.features}-" + "-".join([str(self.hidden)] * self.layers) + "-1]"
        return f"{self.mode} {opt} GC {'on' if self.gc else 'off'}{shape}"


def _strategy_for(mode: str, nranks: int):
    from ..parallel import Strategy

    if mode == "single":
        return Strategy()
    if mode == "gm":
        return Strategy(dp=nranks, gradient_merge_steps=2)
    if mode.startswith("sharding"):
        return Strategy(dp=nranks, sharding_stage=int(mode[-1]))
    return Strategy(dp=nranks, fused_gradients=mode == "dp_fused")


def run_rank(config_json: str, out_dir: str) -> None:
    """The body of one spawned rank (see the module docstring)."""
    import numpy as np

    config = RunConfig(**json.loads(config_json))
    os.chdir(out_dir)  # fleet's sharding writes main_sharding_N files into the cwd
    os.environ["FLAGS_enable_pir_api"] = "0"
    # the legacy executor has no CPU path for collectives; PIR's has (gloo)
    os.environ["FLAGS_enable_pir_in_executor"] = "1"
    import paddle
    import paddle.distributed as dist

    import memopt
    from . import fleet_models
    from ..paddle.flags import runtime_model

    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0 if config.gc else -1.0,
                      "FLAGS_new_executor_sequential_run": True})
    if config.mode != "single":
        dist.init_parallel_env()
    rank = dist.get_rank() if config.mode != "single" else int(os.environ.get(
        "PADDLE_TRAINER_ID", "0"))
    nranks = int(os.environ.get("PADDLE_TRAINERS_NUM", "2"))
    paddle.enable_static()
    paddle.seed(1)
    kwargs = dict(nranks=nranks, features=config.features, hidden=config.hidden,
                  layers=config.layers)
    with open(os.path.join(out_dir, f"build{rank}.log"), "w") as log, \
            contextlib.redirect_stdout(log):  # fleet prints its choices on stdout
        main, startup, loss = fleet_models.build(config.mode, **kwargs)
    if config.level is not None:
        memopt.memory_optimize(main, level=config.level, skip_grads=False)
        if config.release:
            memopt.release_memory(main)
    strategy = _strategy_for(config.mode, nranks)
    global_batch = config.batch * strategy.dp * strategy.gradient_merge_steps
    as_built = main.clone()  # also estimated as fleet built it (with the stream syncs)
    removed = fleet_models.strip_stream_syncs(main)
    fleet_models.one_ring(main)
    as_run = main.clone()  # the program this machine runs: estimated after the run
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    losses = []
    core = paddle.base.core
    step_peaks = []  # each step's own peak (the allocator's peak reset before it)
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        startup_peak = int(core.host_memory_stat_peak_value("Allocated", 0))
        steps = config.steps * (2 if config.mode == "gm" else 1)
        for step in range(steps):
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            value, = exe.run(main, feed=fleet_models.feed(rank, step, config.batch,
                                                          config.features),
                             fetch_list=[loss])
            step_peaks.append(int(core.host_memory_stat_peak_value("Allocated", 0)))
            losses.append(np.asarray(value))
        # the run's peak, before the copies read back below
        peak = max(startup_peak, *step_peaks)
        peak_step1 = max(startup_peak, step_peaks[0])
        params = fleet_models.parameters(main, scope)
    # The estimate needs nothing the run made: computed here, after the
    # measurement, so that its own allocations (program translation) stay out
    # of the measured peak.  The program runs translated to PIR
    # (FLAGS_enable_pir_in_executor): PIR's runtime model.
    runtime = runtime_model("pir")
    est_built = None
    if config.level is None:
        # before launch: the one-device program and the strategy
        with paddle.utils.unique_name.guard(), contextlib.redirect_stdout(None):
            single, _, single_loss = fleet_models.build("single", **kwargs)
        est = memopt.estimate(single, strategy, global_batch, fetch_list=[single_loss],
                              runtime=runtime)
    else:
        # a rank program memopt rewrote: estimated as it is -- as it runs
        # here (the stream syncs, which have no CPU kernel, removed) and as
        # fleet built it (with them)
        est = memopt.estimate(as_run, strategy, global_batch,
                              fetch_list=[as_run.global_block().var(loss.name)],
                              runtime=runtime)
        est_built = memopt.estimate(as_built, strategy, global_batch,
                                    fetch_list=[as_built.global_block().var(loss.name)],
                                    runtime=runtime).total
    # ranks differ under sharding (owners of whole parameters): this rank's
    mine = est.per_rank[rank] if est.per_rank else est.total
    arrays = {f"param:{name}": value for name, value in params}
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), losses=np.stack(losses), **arrays)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "peak": peak, "peak_step1": peak_step1,
                   "step_peaks": step_peaks, "estimate": mine,
                   "estimate_as_built": est_built, "estimate_json": est.to_json(), "syncs_removed": removed,
                   "config": asdict(config)}, f)


def launch(config: RunConfig, out_dir: str, nprocs: int = 2) -> list:
    """Start ``nprocs`` ranks with ``paddle.distributed.spawn`` (gloo) and
    return each rank's record (dict with ``losses``, ``params``, ``peak``,
    ``estimate``), rank order."""
    # read by Paddle when a rank imports it (before run_rank starts)
    rank_env = {"FLAGS_enable_pir_api": "0", "FLAGS_enable_pir_in_executor": "1",
                "FLAGS_new_executor_sequential_run": "1"}
    return _spawn_and_collect(run_rank, config, out_dir, nprocs, rank_env)


def _spawn_and_collect(target, config, out_dir: str, nprocs: int, rank_env: dict) -> list:
    """Run ``target(config_json, out_dir)`` on ``nprocs`` ranks with
    ``paddle.distributed.spawn`` (gloo) under ``rank_env`` (the caller's
    environment is restored afterwards), then read back each rank's
    ``rank<k>.json`` record with its losses and ``param:`` arrays from
    ``rank<k>.npz``; rank order."""
    import numpy as np
    import paddle.distributed as dist

    os.makedirs(out_dir, exist_ok=True)
    saved = {key: os.environ.get(key) for key in rank_env}
    os.environ.update(rank_env)
    try:
        dist.spawn(target, args=(json.dumps(asdict(config)), out_dir), nprocs=nprocs,
                   backend="gloo")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    records = []
    for rank in range(nprocs):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            record = json.load(f)
        data = np.load(os.path.join(out_dir, f"rank{rank}.npz"))
        record["losses"] = data["losses"]
        record["params"] = {k[len("param:"):]: data[k] for k in data.files
                            if k.startswith("param:")}
        records.append(record)
    return records


def same_results(a: dict, b: dict) -> bool:
    """Bit-identical losses and persistable variables (by name)."""
    import numpy as np

    if not np.array_equal(a["losses"], b["losses"]):
        return False
    if sorted(a["params"]) != sorted(b["params"]):
        return False
    return all(np.array_equal(a["params"][k], b["params"][k]) for k in a["params"])


# --- auto-parallel (paddle.distributed.to_static) runs ---------------------


@dataclass(frozen=True)
class AutoParallelConfig:
    """One configuration of a two-rank auto-parallel run.

    mode : a :data:`memopt.testing.auto_parallel_models.MODES` entry, or
        ``"pir_dp"``: a plain PIR data-parallel program
        (:func:`memopt.testing.fleet_models.build_pir_dp`, ``pd_op.all_reduce_``).
    level : None (unoptimized) or memory_optimize's level (0, 1 or 2), applied
        to the rank's PIR program after Paddle's parallel passes, before
        its first step.
    gc : Paddle's garbage collector on or off.
    """

    mode: str = "mp"
    level: Optional[int] = None
    gc: bool = True
    batch: int = 8
    steps: int = 3
    features: int = 16
    hidden: int = 32

    @property
    def label(self) -> str:
        opt = "unoptimized" if self.level is None else f"L{self.level}"
        kind = "PIR" if self.mode == "pir_dp" else "auto-parallel"
        return f"{kind} {self.mode} {opt} GC {'on' if self.gc else 'off'}"


def _comm_ops(names) -> list:
    from ..paddle.distributed import is_communication

    return [name for name in names if is_communication(name)]


def run_auto_parallel_rank(config_json: str, out_dir: str) -> None:
    """The body of one spawned auto-parallel rank: build the DistModel
    (:mod:`memopt.testing.auto_parallel_models`, Paddle patched for CPU
    ranks), read its programs, run ``analyze`` / ``memory_optimize`` on them
    and train ``steps`` steps; writes ``rank{r}.json`` / ``rank{r}.npz``."""
    import traceback

    import numpy as np

    config = AutoParallelConfig(**json.loads(config_json))
    import paddle
    import paddle.distributed as dist

    import memopt
    from . import auto_parallel_models as apm

    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0 if config.gc else -1.0,
                      "FLAGS_new_executor_sequential_run": True})
    captured = apm.install_cpu_patches()
    dist.init_parallel_env()
    rank = dist.get_rank()
    if config.mode == "pir_dp":  # plain PIR data parallel, no auto-parallel
        from . import fleet_models

        paddle.enable_static()
        program, startup, loss = fleet_models.build_pir_dp(features=config.features,
                                                           hidden=config.hidden)
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(startup)

        def step(index):
            with paddle.static.scope_guard(scope):
                return exe.run(program, feed=fleet_models.feed(rank, index, config.batch,
                                                               config.features),
                               fetch_list=[loss])[0]

        batches = range(config.steps)
    else:
        if config.mode == "pp":  # built, not run (see auto_parallel_models)
            apm.skip_initialisation()
        dm, loader = apm.build(config.mode, features=config.features, hidden=config.hidden,
                               batch=config.batch)
        dm.train()  # builds and parallelises the programs, initialises the parameters
        program = apm.main_program(dm)
        scope = None

        def step(batch):
            return dm(*batch)

        batches = [] if config.mode == "pp" else loader
    record = {"rank": rank, "config": asdict(config),
              "comm_ops": _comm_ops(apm.op_names(program))}
    # the program before the reshard pass: dist_op.reshard, pd_dist types
    before = captured["before_reshard"][0] if captured["before_reshard"] else None
    if before is not None:
        record["before_reshard_comm_ops"] = _comm_ops(apm.op_names(before))
        try:
            record["before_reshard_peak"] = memopt.analyze(before).total_peak()
            rep = memopt.memory_optimize(before, level=1, skip_grads=False)
            record["before_reshard_not_merged"] = dict(rep.not_merged)
            record["before_reshard_merged"] = rep.merged_count
            record["before_reshard_comm_ops_after"] = _comm_ops(apm.op_names(before))
        except Exception:  # recorded: the test and the README say what failed
            record["before_reshard_error"] = traceback.format_exc()
    record["predicted_peak"] = memopt.analyze(program).total_peak()
    text_before = str(program)
    if config.level is not None:
        rep = memopt.memory_optimize(program, level=config.level, skip_grads=False)
        record["not_merged"] = dict(rep.not_merged)
        record["merged"] = rep.merged_count
        record["comm_ops_after"] = _comm_ops(apm.op_names(program))
        record["program_changed"] = str(program) != text_before
        record["inplace_on_communication"] = apm.inplace_on_communication(program)
        text = str(program)
        memopt.release_memory(program)  # PIR: Paddle's collector releases; unchanged
        record["release_changed"] = str(program) != text
    core = paddle.base.core
    core.host_memory_stat_reset_peak_value("Allocated", 0)
    losses = []
    for index, batch in enumerate(batches):
        if index == config.steps:
            break
        losses.append(np.asarray(step(batch)))
    record["peak"] = int(core.host_memory_stat_peak_value("Allocated", 0))
    params = apm.parameters(program, scope) if losses else []
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"),
             losses=np.stack(losses) if losses else np.zeros(0),
             **{f"param:{name}": value for name, value in params})
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def launch_auto_parallel(config: AutoParallelConfig, out_dir: str, nprocs: int = 2) -> list:
    """Start ``nprocs`` auto-parallel ranks with ``paddle.distributed.spawn``
    (gloo); each rank's record (as :func:`launch`'s), rank order."""
    return _spawn_and_collect(run_auto_parallel_rank, config, out_dir, nprocs,
                              {"FLAGS_new_executor_sequential_run": "1"})
