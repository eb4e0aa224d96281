"""Two-rank runs of more distributed programs, each rank trying memopt's options.

A face (like :mod:`memopt.testing.dist_runs`, whose spawn-and-collect it reuses):
one launch per strategy of :data:`memopt.testing.fleet_strategies.STRATEGIES`
(``paddle.distributed.spawn``, 2 ranks, gloo, CPU), started in a child
process with a timeout so that a hang is reported, not waited for.  In each
rank the program is built afresh for every option of the launch (the
unoptimized program first: the reference), rewritten, run ``steps``
optimizer steps in a fresh scope, and recorded:

- ``outcome``: ``"ran"``; ``"refused"`` (memopt raised a
  :class:`memopt.errors.MemoptError`: the message is kept and the program
  must be unchanged); ``"refused at run"`` (memopt's guard refused to run
  the rewritten program, naming why); ``"memopt error"`` (any other exception from memopt: a
  raw traceback, a bug); ``"build failed"`` / ``"run failed"`` (Paddle's error);
- the communication ops before and after memopt (type, operands and ring;
  a collective moved, cloned or rewired is a bug);
- losses, every persistable variable after the run (``.npz``);
- each optimizer step's allocator peak
  (``host_memory_stat_peak_value('Allocated', 0)``, reset before the step,
  less what was allocated before the startup program ran) and
  ``memopt.estimate`` of the program as run.

Used by ``tests/sweeps/test_sweep_distributed.py`` and
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
    """Every communication op of ``program`` in order: type, the names (PIR:
    Value ids) it reads and writes, its ring.  Equal before and after an
    in-place rewrite when no collective was moved past another, cloned,
    dropped or rewired."""
    from ..paddle.distributed import is_communication

    out = []
    if ir == "legacy":
        for block in program.blocks:
            for op in block.ops:
                if is_communication(op.type):
                    ring = op.attr("ring_id") if op.has_attr("ring_id") else None
                    out.append([block.idx, op.type, list(op.input_arg_names),
                                list(op.output_arg_names), ring])
        return out
    # PIR: the Values' ids (stable while the program is rewritten in place;
    # a comm op rewired to another Value, e.g. a clone, shows), not places
    for op in program.global_block().ops:
        if is_communication(op.name()):
            reads = [op.operand_source(k).id for k in range(op.num_operands())]
            writes = [r.id for r in op.results()]
            out.append([0, op.name(), reads, writes, op.attrs().get("ring_id")])
    return out


def _strip_depends(program) -> int:
    """Remove the legacy ``depend`` ops fused data parallel puts after its
    ``coalesce_tensor`` + ``all_reduce`` (``Out`` = ``X``: they only order
    ops); Paddle 3.3.1's translation to PIR, which the CPU collectives need,
    refuses them (``Op depend should have corresponding OpInfo
    pd_op.depend_``).  Returns how many were removed."""
    removed = 0
    for block in program.blocks:
        for index in reversed(range(len(block.ops))):
            op = block.ops[index]
            if op.type == "depend" and op.input("X") == op.output("Out"):
                block._remove_op(index)
                removed += 1
    program._sync_with_cpp()
    return removed


def _budget_for(program, fraction: float, batch: int, fetch: dict) -> int:
    """The budget ``fraction`` of the way from memopt's smallest budget to
    the program's predicted peak (both at ``batch``; ``fetch``: the
    ``fetch_list`` keyword or nothing)."""
    import memopt

    full = memopt.analyze(program, batch_size=batch, **fetch).total_peak()
    try:
        # refused: the program is left as it is (fitting, it would be rewritten)
        memopt.memory_optimize(program, budget=1, batch_size=batch, **fetch)
        smallest = 1
    except memopt.BudgetError as exc:
        smallest = exc.smallest_budget
    return int(smallest + fraction * max(0, full - smallest))


def _call_memopt(program, loss, option: Option, batch: int, rec: dict) -> bool:
    """``memory_optimize`` as ``option`` says, the outcome written into
    ``rec``; True when the program was rewritten.  ``loss``: the value to
    fetch (None: no ``fetch_list``)."""
    import memopt
    from ..errors import MemoptError

    fetch = {"fetch_list": [loss]} if loss is not None else {}
    kwargs = {"level": option.level or 0, "skip_grads": False}
    text = str(program)
    try:
        if option.budget is not None:
            kwargs = {**fetch, "batch_size": batch,
                      "budget": _budget_for(program, option.budget, batch, fetch)}
            rec["budget"] = kwargs["budget"]
        elif option.level == 2:
            kwargs["batch_size"] = batch
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


def _one_option(config: SweepConfig, option: Option, ir: str, rank: int, nranks: int,
                out_dir: str, index: int) -> dict:
    import numpy as np
    import paddle

    import memopt
    from ..errors import MemoptError
    from . import fleet_models, fleet_strategies
    from ..paddle.flags import runtime_model
    from ..parallel import Strategy

    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0 if option.gc else -1.0})
    rec: dict = {"option": asdict(option), "label": option.label}
    k = fleet_strategies.k_steps(config.strategy)

    def call_memopt(program, loss):
        return _call_memopt(program, loss, option, config.batch, rec)

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
        return _fail(rec, "build failed")
    if not state["ok"]:
        return rec
    rec["comm_before"] = _comm_signature(main, ir)
    if not option.before and (option.level is not None or option.budget is not None):
        if not call_memopt(main, loss):
            return rec
    rec["comm_after"] = _comm_signature(main, ir)
    if ir == "legacy":
        rec["syncs_removed"] = fleet_models.strip_stream_syncs(main)
        rec["depends_removed"] = _strip_depends(main)
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
    except MemoptError as exc:  # memopt's guard refused the run (by name)
        return _fail(rec, "refused at run", exc)
    except Exception:
        return _fail(rec, "run failed")
    rec["outcome"] = "ran"
    rec["micro_peaks"] = peaks
    rec["step_peaks"] = _step_peaks(peaks, k)
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


def _one_auto_parallel_option(config: SweepConfig, option: Option, rank: int,
                              out_dir: str, index: int) -> dict:
    """One option on an auto-parallel rank (``paddle.distributed.to_static``,
    :func:`memopt.testing.fleet_strategies.auto_parallel`): memopt on the
    rank's PIR program after Paddle's parallel passes, before its first
    step.  No estimate: the DistModel's dygraph tensors sit around the step
    (see the README)."""
    import numpy as np
    import paddle

    from ..errors import MemoptError
    from . import auto_parallel_models as apm
    from . import fleet_strategies

    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0 if option.gc else -1.0})
    rec: dict = {"option": asdict(option), "label": option.label}
    k = fleet_strategies.k_steps(config.strategy)
    try:
        mode, strategy = fleet_strategies.auto_parallel(config.strategy)
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            dm, loader = apm.build(mode, features=config.features, hidden=config.hidden,
                                   batch=8, strategy=strategy)
            dm.train()
        program = apm.main_program(dm)
    except Exception:
        return _fail(rec, "build failed")
    rec["comm_before"] = _comm_signature(program, "pir")
    if option.level is not None or option.budget is not None:
        if not _call_memopt(program, None, option, 8, rec):
            return rec
    rec["comm_after"] = _comm_signature(program, "pir")
    core = paddle.base.core
    losses, peaks = [], []
    # the earlier options' DistModels hold their memory: each step's peak
    # above what was allocated before this option's first step
    base = int(core.host_memory_stat_current_value("Allocated", 0))
    try:
        for step, batch in enumerate(loader):
            if step == config.steps * k:
                break
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            losses.append(np.asarray(dm(*batch)))
            peaks.append(int(core.host_memory_stat_peak_value("Allocated", 0)) - base)
    except MemoptError as exc:
        return _fail(rec, "refused at run", exc)
    except Exception:
        return _fail(rec, "run failed")
    rec["outcome"] = "ran"
    rec["step_peaks"] = _step_peaks(peaks, k)
    rec["step_growth"] = min(rec["step_peaks"][1:4] or rec["step_peaks"])
    params = _pir_persistables(program, paddle.static.global_scope())
    np.savez(os.path.join(out_dir, f"rank{rank}_opt{index}.npz"), losses=np.stack(losses),
             **{f"param:{name}": value for name, value in params})
    return rec


def _fail(rec: dict, outcome: str, refusal: Exception = None) -> dict:
    """``rec`` marked ``outcome``: with memopt's ``refusal``, its message;
    otherwise the tail of the traceback being handled."""
    rec["outcome"] = outcome
    rec["message"] = (f"{type(refusal).__name__}: {refusal}"[:600] if refusal is not None
                      else traceback.format_exc()[-1500:])
    return rec


def _step_peaks(peaks: list, k: int) -> list:
    """One optimizer step = ``k`` micro-steps: its peak is theirs."""
    return [max(peaks[i:i + k]) for i in range(0, len(peaks), k)]


def _pir_persistables(program, scope) -> list:
    """``[(key, ndarray)]`` of a PIR program's parameters and persistable
    optimizer state (the scope's initialized dense tensors the program's
    ``builtin.parameter`` / ``set_parameter`` / ``shadow_output`` ops name),
    keyed by their place in the program's op order: a second build of the
    same program in one process names its parameters anew (``fc_4.w_0`` for
    ``fc_0.w_0``), the op order is the same."""
    import numpy as np

    names = []
    for op in program.global_block().ops:
        if op.name() not in ("builtin.parameter", "builtin.set_parameter",
                             "builtin.shadow_output"):
            continue
        attrs = op.attrs()
        name = attrs.get("parameter_name") or attrs.get("output_name")
        if isinstance(name, str) and name not in names:
            names.append(name)
    out = []
    for index, name in enumerate(names):
        var = scope.find_var(name)
        if var is None:
            continue
        try:
            tensor = var.get_tensor()
            if tensor._is_initialized():
                out.append((f"{index:03d}", np.array(tensor)))
        except Exception:  # not a dense tensor
            continue
    return out


def run_rank(config_json: str, out_dir: str) -> None:
    """The body of one spawned rank: every option of the launch in turn."""
    raw = json.loads(config_json)
    raw["options"] = tuple(Option(**o) for o in raw["options"])
    config = SweepConfig(**raw)
    os.chdir(out_dir)  # fleet's sharding writes main_sharding_N files into the cwd
    import paddle
    import paddle.distributed as dist

    from . import fleet_strategies

    ir = fleet_strategies.STRATEGIES[config.strategy][1]
    paddle.set_flags({"FLAGS_new_executor_sequential_run": True})
    if ir == "auto":
        from . import auto_parallel_models

        auto_parallel_models.install_cpu_patches()
    dist.init_parallel_env()
    rank, nranks = dist.get_rank(), dist.get_world_size()
    if ir == "auto":
        records = [_one_auto_parallel_option(config, option, rank, out_dir, i)
                   for i, option in enumerate(config.options)]
    else:
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

    from .fleet_strategies import STRATEGIES

    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ)
    from .workers import ROOT

    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["FLAGS_new_executor_sequential_run"] = "1"
    if STRATEGIES[config.strategy][1] == "legacy":
        # the legacy executor has no CPU path for collectives; PIR's has (gloo)
        env.update({"FLAGS_enable_pir_api": "0", "FLAGS_enable_pir_in_executor": "1"})
    cfg = asdict(config)
    proc = subprocess.Popen([sys.executable, "-m", "memopt.testing.dist_sweep", json.dumps(cfg),
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
    if rec["outcome"] == "refused at run":
        return "refused at run"
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
    if rec.get("budget") and rec.get("measured") and rec["measured"] > rec["budget"]:
        # not counted as a bug: see the README (GC on, the collector's lag)
        return f"over budget: measured {rec['measured']} > budget {rec['budget']}"
    return "ok"


if __name__ == "__main__":
    import paddle.distributed as dist

    from memopt.testing.dist_sweep import run_rank as _target  # by its module name, for spawn

    dist.spawn(_target, args=(sys.argv[1], sys.argv[2]), nprocs=2, backend="gloo")
