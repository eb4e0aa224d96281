"""One rank's training program under more fleet strategies (the sweep's).

For ``memopt.testing.dist_sweep`` and ``tests/sweeps/test_sweep_distributed.py``: a small MLP
regression model (``features`` -> ``layers`` x ``hidden`` ReLU -> 1, mean
squared error) handed to ``fleet.distributed_optimizer(...).minimize`` (legacy
IR, ``FLAGS_enable_pir_api=0``) under one of :data:`STRATEGIES`, or rewritten
for data parallelism by hand.  :mod:`memopt.testing.fleet_models` holds the
configurations the bench and ``test_distributed.py`` already run (dp,
sharding, gradient merge k=2); these are the others.

``build(name, hook=...)`` returns ``(main, startup, loss)``; ``hook(main,
loss)``, when given, runs on the forward program before the optimizer's
``minimize`` (so ``memory_optimize`` can be called where Paddle lets a user
call it before the backward part exists).
"""
from __future__ import annotations

import contextlib
import io

#: name -> (what it is, the IR it is built in)
STRATEGIES = {
    "gm4": ("fleet gradient merge k_steps=4 avg, Momentum", "legacy"),
    "gm3_noavg": ("fleet gradient merge k_steps=3 avg=False, Momentum", "legacy"),
    "recompute": ("fleet recompute, checkpoints = the hidden layers' outputs", "legacy"),
    "lars": ("fleet lars (lars_momentum)", "legacy"),
    "lamb": ("fleet lamb (Adam -> lamb)", "legacy"),
    "fuse_1mb": ("fleet fuse_all_reduce_ops, fuse_grad_size_in_MB=1", "legacy"),
    "graph_opt": ("fleet without_graph_optimization=False", "legacy"),
    "sharding_adam": ("fleet sharding (degree 2), Adam", "legacy"),
    "sharding_gm": ("fleet sharding + gradient_merge_acc_step=2", "legacy"),
    "amp_o1": ("fleet amp O1", "legacy"),
    "amp_o2": ("fleet amp O2 (use_pure_fp16)", "legacy"),
    "pipeline": ("fleet pipeline, 2 stages (device_guard cpu:0 / cpu:1)", "legacy"),
    "hand_allreduce": ("no fleet: c_allreduce_sum + scale on each gradient", "legacy"),
    "hand_all_reduce_op": ("no fleet: legacy all_reduce + scale on each gradient", "legacy"),
    "tp_split": ("paddle.distributed.split (column- then row-parallel fc)", "legacy"),
    "fleet_pir": ("fleet data parallel under PIR", "pir"),
    "pir_adam": ("no fleet, PIR: all_reduce_ on each gradient, Adam, 3 layers", "pir"),
    "ap_mp_gm2": ("auto-parallel mp (to_static) + gradient_merge k_steps=2 avg", "auto"),
    "ap_dp_sharding1": ("auto-parallel dp (to_static) + sharding stage 1", "auto"),
    "ap_mp_amp_bf16": ("auto-parallel mp (to_static) + amp O1 bfloat16", "auto"),
}

#: strategies whose program holds a conditional_block (the update step)
MERGING = ("gm4", "gm3_noavg", "sharding_gm")


def k_steps(name: str) -> int:
    """Micro-steps per optimizer step of a strategy."""
    return {"gm4": 4, "gm3_noavg": 3, "sharding_gm": 2, "ap_mp_gm2": 2}.get(name, 1)


def auto_parallel(name: str):
    """``(mode, strategy)`` of an auto-parallel entry (``"ap_*"``): the
    :mod:`memopt.testing.auto_parallel_models` mode and the
    ``paddle.distributed.Strategy`` handed to ``to_static``."""
    import paddle.distributed as dist

    strategy = dist.Strategy()
    if name == "ap_mp_gm2":
        strategy.gradient_merge.enable = True
        strategy.gradient_merge.k_steps = 2
        strategy.gradient_merge.avg = True
    elif name == "ap_dp_sharding1":
        strategy.sharding.enable = True
        strategy.sharding.stage = 1
        strategy.sharding.degree = 2
    elif name == "ap_mp_amp_bf16":
        strategy.amp.enable = True
        strategy.amp.dtype = "bfloat16"
        strategy.amp.level = "O1"
    return name.split("_")[1], strategy


def _fleet_strategy(name: str, nranks: int):
    from paddle.distributed import fleet

    s = fleet.DistributedStrategy()
    s.fuse_all_reduce_ops = False
    if name in ("gm4", "gm3_noavg"):
        s.gradient_merge = True
        s.gradient_merge_configs = {"k_steps": k_steps(name), "avg": name == "gm4"}
    elif name == "recompute":
        s.recompute = True
    elif name == "lars":
        s.lars = True
        s.lars_configs = {"lars_coeff": 0.001, "lars_weight_decay": 0.0005}
    elif name == "lamb":
        s.lamb = True
    elif name == "fuse_1mb":
        s.fuse_all_reduce_ops = True
        s.fuse_grad_size_in_MB = 1
    elif name == "graph_opt":
        s.without_graph_optimization = False
    elif name in ("sharding_adam", "sharding_gm"):
        s.sharding = True
        s.sharding_configs = {"sharding_degree": nranks}
        if name == "sharding_gm":
            s.sharding_configs = {"sharding_degree": nranks, "gradient_merge_acc_step": 2}
    elif name in ("amp_o1", "amp_o2"):
        s.amp = True
        s.amp_configs = {"init_loss_scaling": 1024.0, "use_pure_fp16": name == "amp_o2"}
    elif name == "pipeline":
        s.pipeline = True
        s.pipeline_configs = {"micro_batch_size": 4, "accumulate_steps": 2}
    elif name == "fleet_pir":
        pass
    return s


def _optimizer(name: str):
    import paddle

    if name in ("lamb", "sharding_adam", "pir_adam"):
        return paddle.optimizer.Adam(0.01)
    return paddle.optimizer.Momentum(0.01, momentum=0.9)


def _hand_all_reduce(main, params_grads, nranks: int, op_type: str) -> None:
    """Insert ``op_type`` (in place) and ``scale 1/nranks`` on each gradient,
    right after the backward part (what fleet's data parallel does)."""
    block = main.global_block()
    for _, grad in params_grads:
        attrs = {"ring_id": 0}
        if op_type == "c_allreduce_sum":
            attrs["use_calc_stream"] = True
        else:
            attrs["reduce_type"] = 0
        block.append_op(type=op_type, inputs={"x" if op_type == "all_reduce" else "X": grad},
                        outputs={"out" if op_type == "all_reduce" else "Out": grad},
                        attrs=attrs)
        block.append_op(type="scale", inputs={"X": grad}, outputs={"Out": grad},
                        attrs={"scale": 1.0 / nranks})


def build(name: str, *, nranks: int = 2, features: int = 64, hidden: int = 128,
          layers: int = 2, seed: int = 7, hook=None):
    """``(main, startup, loss)`` of one rank's program under strategy
    ``name`` (a :data:`STRATEGIES` key).  Call in static mode, in the IR the
    strategy names, with the rank environment set (a launcher's or
    :func:`memopt.testing.fleet_models.set_rank_env`).  Feeds: ``x``
    ``[-1, features]``, ``y`` ``[-1, 1]`` float32.  Paddle's own errors
    (a strategy it cannot build here) propagate."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {sorted(STRATEGIES)}, got {name!r}")
    import paddle
    from paddle.distributed import fleet

    from .fleet_models import _no_communicator_setup

    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = seed
    fleet_strategy = None
    uses_fleet = not name.startswith(("hand_", "tp_", "pir_"))
    if name == "tp_split":  # paddle.distributed.split asks fleet for its group
        fleet.init(is_collective=True)
    if uses_fleet:
        fleet_strategy = _fleet_strategy(name, nranks)
        fleet.init(is_collective=True, strategy=fleet_strategy)
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [-1, features], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        h, outputs = x, []
        for index in range(layers + (1 if name == "pir_adam" else 0)):
            device = f"cpu:{min(index * nranks // layers, nranks - 1)}" \
                if name == "pipeline" else None
            with paddle.static.device_guard(device):
                if name == "tp_split" and index < 2:
                    h = paddle.distributed.split(h, (h.shape[-1], hidden), "linear",
                                                 axis=1 - index, num_partitions=nranks,
                                                 gather_out=index == 1)
                    h = paddle.nn.functional.relu(h)
                else:
                    h = paddle.static.nn.fc(h, hidden, activation="relu")
            outputs.append(h)
        with paddle.static.device_guard(f"cpu:{nranks - 1}" if name == "pipeline" else None):
            out = paddle.static.nn.fc(h, 1)
            loss = paddle.mean((out - y) ** 2)
        if hook is not None:
            hook(main, loss)
        opt = _optimizer(name)
        if uses_fleet:
            if name == "recompute":
                fleet_strategy.recompute_configs = {"checkpoints": [v.name for v in outputs]}
            with _no_communicator_setup(), contextlib.redirect_stdout(io.StringIO()):
                fleet.distributed_optimizer(opt, fleet_strategy).minimize(loss)
        elif name == "pir_adam":
            import paddle.distributed as dist

            averaged = []
            for param, grad in paddle.static.append_backward(loss):
                dist.all_reduce(grad)
                averaged.append((param, paddle.scale(grad, 1.0 / nranks)))
            opt.apply_gradients(averaged)
        else:
            params_grads = paddle.static.append_backward(loss)
            if name.startswith("hand_"):
                _hand_all_reduce(main, params_grads, nranks,
                                 "c_allreduce_sum" if name == "hand_allreduce" else "all_reduce")
            opt.apply_gradients(params_grads)
    return main, startup, loss
