"""Two-rank runs of more distributed programs, each rank trying memopt's options.

A face (like :mod:`memopt.dist_runs`, whose spawn-and-collect it reuses):
one launch per strategy of :data:`memopt.paddle.fleet_strategies.STRATEGIES`
(``paddle.distributed.spawn``, 2 ranks, gloo, CPU), started in a child
process with a timeout so that a hang is reported, not waited for.  In each
rank the program is built afresh for every option of the launch (the
unoptimized program first: the reference), rewritten, run ``steps``
optimizer steps in a fresh scope, and recorded:

- ``outcome``: ``"ran"``; ``"refused"`` (memopt raised a
  :class:`memopt.errors.MemoptError`: the message is kept and the program
  must be unchanged); ``"memopt error"`` (any other exception from memopt: a
  raw traceback, a bug); ``"build failed"`` / ``"run failed"`` (Paddle's error);
- the communication ops before and after memopt (type, operands and ring;
  a collective moved, cloned or rewired is a bug);
- losses, every persistable variable after the run (``.npz``);
- each optimizer step's allocator peak
  (``host_memory_stat_peak_value('Allocated', 0)``, reset before the step,
  less what was allocated before the startup program ran) and
  ``memopt.estimate`` of the program as run.

Used by ``scripts/sweep_distributed.py`` and
``tests/memopt/paddle/test_distributed_sweep.py``.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import traceback
from dataclasses import asdict, dataclass, field
from typing import Optional, Tuple


@dataclass(frozen=True)
class Option:
    """One way to call memopt on a rank's program.

    level : None (unoptimized), 0, 1 or 2.
    budget : a fraction: ``budget=`` at this point between memopt's
        ``smallest_budget`` (0.0) and the unoptimized program's predicted
        peak (1.0); None for no budget.
    gc : Paddle's garbage collector on (``FLAGS_eager_delete_tensor_gb=0``)
        or off (-1), for memopt's plan and for the run.
    before : call ``memory_optimize`` on the forward program, before the
        optimizer's ``minimize`` builds the backward part (and fleet
        rewrites the program).
    """

    level: Optional[int] = None
    budget: Optional[float] = None
    gc: bool = True
    before: bool = False

    @property
    def label(self) -> str:
        if self.budget is not None:
            opt = f"budget {self.budget:g}"
        else:
            opt = "unoptimized" if self.level is None else f"L{self.level}"
        return f"{opt}{' before minimize' if self.before else ''} GC {'on' if self.gc else 'off'}"


@dataclass(frozen=True)
class SweepConfig:
    """One launch: a strategy and the options each rank tries in turn."""

    strategy: str = "gm4"
    options: Tuple[Option, ...] = field(default_factory=lambda: (Option(),))
    steps: int = 4
    batch: int = 16
    features: int = 64
    hidden: int = 128
    layers: int = 2


def _comm_signature(program, ir: str) -> list:
    """Every communication op of ``program`` in order: type, the names (or
    value ids) it reads and writes, its ring."""
    from .paddle.distributed import is_communication

    out = []
    if ir == "legacy":
        for block in program.blocks:
            for op in block.ops:
                if is_communication(op.type):
                    ring = op.attr("ring_id") if op.has_attr("ring_id") else None
                    out.append([block.idx, op.type, list(op.input_arg_names),
                                list(op.output_arg_names), ring])
        return out
    ops = list(program.global_block().ops)
    index = {}
    for i, op in enumerate(ops):
        for r in op.results():
            index[r.id] = i
    for op in ops:
        if is_communication(op.name()):
            reads = [index.get(op.operand_source(k).id, -1) for k in range(op.num_operands())]
            ring = op.attrs().get("ring_id")
            out.append([0, op.name(), reads, len(op.results()), ring])
    return out


def _budget_for(program, fraction: float, batch: int, loss) -> int:
    """The budget ``fraction`` of the way from memopt's smallest budget to
    the program's predicted peak (both at ``batch``)."""
    import memopt

    full = memopt.analyze(program, fetch_list=[loss], batch_size=batch).total_peak()
    try:
        memopt.memory_optimize(program.clone(), fetch_list=[loss], budget=1,
                               batch_size=batch)
        smallest = 1
    except memopt.BudgetError as exc:
        smallest = exc.smallest_budget
    return int(smallest + fraction * max(0, full - smallest))


def _one_option(config: SweepConfig, option: Option, ir: str, rank: int, nranks: int,
                out_dir: str, index: int) -> dict:
    import numpy as np
    import paddle

    import memopt
    from .errors import MemoptError
    from .paddle import fleet_models, fleet_strategies
    from .paddle.flags import runtime_model
    from .parallel import Strategy

    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0 if option.gc else -1.0})
    rec: dict = {"option": asdict(option), "label": option.label}
    k = fleet_strategies.k_steps(config.strategy)

    def call_memopt(program, loss):
        kwargs = {"level": option.level or 0, "skip_grads": False}
        text = str(program)
        try:
            if option.budget is not None:
                kwargs = {"fetch_list": [loss], "batch_size": config.batch,
                          "budget": _budget_for(program, option.budget, config.batch, loss)}
                rec["budget"] = kwargs["budget"]
            report = memopt.memory_optimize(program, **kwargs)
        except MemoptError as exc:
            rec["outcome"] = "refused"
            rec["message"] = f"{type(exc).__name__}: {exc}"[:600]
            rec["unchanged"] = str(program) == text
            return False
        except Exception:
            rec["outcome"] = "memopt error"
            rec["message"] = traceback.format_exc()[-2000:]
            return False
        rec["merged"] = report.merged_count
        rec["report"] = str(report)[-1500:]
        return True

    state = {"ok": True}

    def hook(main, loss):
        if option.before and option.level is not None:
            state["ok"] = call_memopt(main, loss)

    try:
        with paddle.utils.unique_name.guard(), \
                contextlib.redirect_stdout(open(os.devnull, "w")):
            main, startup, loss = fleet_strategies.build(
                config.strategy, nranks=nranks, features=config.features,
                hidden=config.hidden, layers=config.layers, hook=hook)
    except Exception:
        if "outcome" in rec:
            return rec
        rec["outcome"] = "build failed"
        rec["message"] = traceback.format_exc()[-1500:]
        return rec
    if not state["ok"]:
        return rec
    rec["comm_before"] = _comm_signature(main, ir)
    if not option.before and (option.level is not None or option.budget is not None):
        if not call_memopt(main, loss):
            return rec
    rec["comm_after"] = _comm_signature(main, ir)
    if ir == "legacy":
        rec["syncs_removed"] = fleet_models.strip_stream_syncs(main)
        fleet_models.one_ring(main)
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    core = paddle.base.core
    losses, peaks = [], []
    try:
        with paddle.static.scope_guard(scope):
            base = int(core.host_memory_stat_current_value("Allocated", 0))
            exe.run(startup)
            for step in range(config.steps * k):
                core.host_memory_stat_reset_peak_value("Allocated", 0)
                value, = exe.run(main, feed=fleet_models.feed(rank, step, config.batch,
                                                              config.features),
                                 fetch_list=[loss])
                peaks.append(int(core.host_memory_stat_peak_value("Allocated", 0)) - base)
                losses.append(np.asarray(value))
            params = fleet_models.parameters(main, scope) if ir == "legacy" else \
                _pir_persistables(main, scope)
    except Exception:
        rec["outcome"] = "run failed"
        rec["message"] = traceback.format_exc()[-1500:]
        return rec
    rec["outcome"] = "ran"
    # one optimizer step = k micro-steps: its peak is theirs
    rec["step_peaks"] = [max(peaks[i:i + k]) for i in range(0, len(peaks), k)]
    later = rec["step_peaks"][1:4] or rec["step_peaks"]
    rec["measured"] = min(later)
    try:
        strategy = Strategy(dp=nranks, gradient_merge_steps=k)
        est = memopt.estimate(main, strategy, config.batch * nranks * k, fetch_list=[loss],
                              runtime=runtime_model("pir"))
        rec["estimate"] = est.per_rank[rank] if est.per_rank else est.total
        rec["estimate_components"] = dict(est.components)
    except Exception:
        rec["estimate_error"] = traceback.format_exc()[-1500:]
    np.savez(os.path.join(out_dir, f"rank{rank}_opt{index}.npz"), losses=np.stack(losses),
             **{f"param:{name}": value for name, value in params})
    return rec


def _pir_persistables(program, scope) -> list:
    """``[(name, ndarray)]`` of a PIR program's parameters and persistable
    optimizer state (the scope's initialized dense tensors the program
    names), sorted by name."""
    import numpy as np

    names = set()
    for op in program.global_block().ops:
        attrs = op.attrs()
        for key in ("parameter_name", "name"):
            if key in attrs and isinstance(attrs[key], str) and op.name() in (
                    "builtin.parameter", "pd_op.data", "builtin.set_parameter",
                    "builtin.shadow_output"):
                names.add(attrs[key])
    out = []
    for name in sorted(names):
        var = scope.find_var(name)
        if var is None:
            continue
        try:
            tensor = var.get_tensor()
            if tensor._is_initialized():
                out.append((name, np.array(tensor)))
        except Exception:  # not a dense tensor
            continue
    return [(n, v) for n, v in out if n not in ("x", "y")]


def run_rank(config_json: str, out_dir: str) -> None:
    """The body of one spawned rank: every option of the launch in turn."""
    raw = json.loads(config_json)
    raw["options"] = tuple(Option(**o) for o in raw["options"])
    config = SweepConfig(**raw)
    os.chdir(out_dir)  # fleet's sharding writes main_sharding_N files into the cwd
    import paddle
    import paddle.distributed as dist

    from .paddle import fleet_strategies

    ir = fleet_strategies.STRATEGIES[config.strategy][1]
    paddle.set_flags({"FLAGS_new_executor_sequential_run": True})
    dist.init_parallel_env()
    rank, nranks = dist.get_rank(), dist.get_world_size()
    paddle.enable_static()
    paddle.seed(1)
    records = [_one_option(config, option, ir, rank, nranks, out_dir, i)
               for i, option in enumerate(config.options)]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "ir": ir, "options": records}, f)


def launch(config: SweepConfig, out_dir: str, timeout: float = 120.0) -> dict:
    """Run ``config`` on two spawned ranks in a child process killed after
    ``timeout`` seconds.  Returns ``{"status": "done" | "timeout" |
    "failed", "ranks": [record per rank], "stderr": tail}``; each rank's
    option records carry ``losses`` and ``params`` read back from the
    ``.npz`` files."""
    import numpy as np

    from .paddle.fleet_strategies import STRATEGIES

    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["FLAGS_new_executor_sequential_run"] = "1"
    if STRATEGIES[config.strategy][1] == "legacy":
        # the legacy executor has no CPU path for collectives; PIR's has (gloo)
        env.update({"FLAGS_enable_pir_api": "0", "FLAGS_enable_pir_in_executor": "1"})
    cfg = asdict(config)
    proc = subprocess.Popen([sys.executable, "-m", "memopt.dist_sweep", json.dumps(cfg),
                             out_dir], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        status = "done" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the ranks it spawned
        output, _ = proc.communicate()
        status = "timeout"
    ranks = []
    for rank in range(2):
        path = os.path.join(out_dir, f"rank{rank}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            record = json.load(f)
        for i, rec in enumerate(record["options"]):
            data_path = os.path.join(out_dir, f"rank{rank}_opt{i}.npz")
            if os.path.exists(data_path):
                data = np.load(data_path)
                rec["losses"] = data["losses"]
                rec["params"] = {k[6:]: data[k] for k in data.files if k.startswith("param:")}
        ranks.append(record)
    if len(ranks) < 2 and status == "done":
        status = "failed"
    return {"status": status, "ranks": ranks,
            "stderr": output.decode(errors="replace")[-3000:]}


def verdict(reference: dict, rec: dict) -> str:
    """What one option's record on one rank says against the unoptimized
    reference of the same rank: ``"ok"``, ``"refused"``, or a bug's
    description (``"BUG: ..."``)."""
    import numpy as np

    if rec["outcome"] == "refused":
        return "refused" if rec.get("unchanged") else "BUG: refused but changed the program"
    if rec["outcome"] != "ran":
        return f"BUG: {rec['outcome']}"
    if rec.get("comm_before") != rec.get("comm_after"):
        return "BUG: communication ops changed"
    if not np.array_equal(reference["losses"], rec["losses"]):
        return "BUG: losses differ"
    if sorted(reference["params"]) != sorted(rec["params"]):
        return "BUG: persistable variables differ (names)"
    for name, value in reference["params"].items():
        if not np.array_equal(value, rec["params"][name]):
            return f"BUG: {name} differs"
    if rec.get("budget") and rec["measured"] > rec["budget"]:
        return f"BUG: measured {rec['measured']} > budget {rec['budget']}"
    return "ok"


if __name__ == "__main__":
    import paddle.distributed as dist

    from memopt.dist_sweep import run_rank as _target  # by its module name, for spawn

    dist.spawn(_target, args=(sys.argv[1], sys.argv[2]), nprocs=2, backend="gloo")
