"""The ``memopt`` command.

::

    memopt analyze  MODEL [--batch-size N] [--budget 16GiB] [--top K] [--json] [--html OUT.html]
    memopt optimize MODEL [--level 0|1|2] [--budget 512MiB -b N] [--skip NAME ...] [--fetch NAME ...] [--keep-grads]
                    [--release] -o OUT [--json] [--html OUT.html]
    memopt estimate MODEL -b N [--dp D] [--tp T] [--pp P] [--sharding-stage S] [--json] [--html OUT.html]
    memopt plan     PROBLEM.csv [--exact] [--time-limit S] [-o OUT.csv] [--json]
    memopt plot     MODEL -o timeline.png [--batch-size N] [--level 0|1] [--top K]
    memopt plot     PROBLEM.csv -o arena.png [--exact] [--time-limit S]

MODEL is a saved Paddle program: ``.pdmodel`` (legacy), ``.json`` (PIR),
the prefix given to ``paddle.static.save`` / ``save_inference_model`` /
``jit.save``, or a directory holding a legacy ``__model__`` (see
:mod:`memopt.paddle.modelio`).  An output path is checked before any work
(:mod:`memopt.cli_paths`): its directory must exist, and it is never an
input.

Exit codes: 0 success, 1 a user error (a one-line message on stderr:
missing or corrupt file, an output path that cannot be written or names an
input, a value the program refuses), 2 wrong usage (argparse's message: an
unknown command or flag, a bad option value such as ``-b 0``).
``--debug`` shows the traceback of an error.  Slow steps show progress on
stderr: a live line when stderr is a terminal, otherwise one line per step
that takes more than a couple of seconds.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import threading
import time
import warnings
from typing import List, Optional

from .errors import MemoptError

__all__ = ["main", "build_parser"]

#: Seconds a step may take before a non-terminal stderr hears about it.
QUIET_SECONDS = 2.0


class Progress:
    """Progress of slow steps on stderr.

    On a terminal, a line ``memopt: <step> ... 3.2 s`` is redrawn while a
    step runs and cleared when it ends.  Elsewhere (a pipe, a log file) a
    step that takes more than :data:`QUIET_SECONDS` prints one line when it
    ends, so logs show where the time went without noise for quick runs.
    """

    def __init__(self, stream=None, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, label: str) -> "_Step":
        return _Step(self, label)


class _Step:
    def __init__(self, progress: Progress, label: str) -> None:
        self.progress, self.label = progress, label
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "_Step":
        self.start = time.perf_counter()
        if self.progress.enabled and self.progress.tty:
            self._thread = threading.Thread(target=self._spin, daemon=True)
            self._thread.start()
        return self

    def _spin(self) -> None:
        frames = "|/-\\"
        k = 0
        while not self._stop.wait(0.2):
            elapsed = time.perf_counter() - self.start
            self.progress.stream.write(
                f"\rmemopt: {self.label} {frames[k % 4]} {elapsed:5.1f} s")
            self.progress.stream.flush()
            k += 1

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.progress.stream.write("\r\033[K")
            self.progress.stream.flush()
        elapsed = time.perf_counter() - self.start
        if self.progress.enabled and not self.progress.tty and elapsed > QUIET_SECONDS \
                and exc[0] is None:
            self.progress.stream.write(f"memopt: {self.label}: {elapsed:.1f} s\n")
            self.progress.stream.flush()


# -- helpers ------------------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value}")
    return value


def _bytes_arg(text: str) -> int:
    from .report import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def _is_problem(path: str) -> bool:
    return path.lower().endswith(".csv")


def _load(path: str, progress: Progress):
    from .paddle.modelio import load_model

    with progress.step(f"loading {os.path.basename(path)}"):
        return load_model(path)


def _note_dynamic_dims(loaded) -> None:
    """Say on stderr when an input has several -1 dimensions (all are B)."""
    from .paddle.modelio import dynamic_dims_note

    note = dynamic_dims_note(loaded)
    if note:
        print(f"memopt: note: {note}", file=sys.stderr)


def _guard(loaded):
    """The IR guard the program was built in (so Paddle treats it right)."""
    from .testing.models import ir_guard

    return ir_guard(loaded.ir)


def _read_problem(path: str):
    from .errors import ModelFileError
    from .problems import read_csv

    if not os.path.isfile(path):
        raise ModelFileError(f"no such file: {path}")
    if not _is_problem(path):  # read_csv quoted a whole .json program as its "header"
        raise ModelFileError(f"{path}: 'memopt plan' takes an interval problem (.csv: "
                             "id,lower,upper,size); for a Paddle program use 'memopt analyze', "
                             "'memopt optimize' or 'memopt plot'")
    return read_csv(path)


def _plan_problem(problem, exact: bool, time_limit: Optional[float], progress: Progress):
    from . import arena

    mode = "exact" if exact else "default"
    if (exact or time_limit is not None) and hasattr(arena, "_load_kernels"):
        # the search kernels compile on a machine's first run (tens of
        # seconds, not counted against --time-limit): a step of its own, so
        # the planning step's time is the limit's (an --exact --time-limit 10
        # plan took 37 s on a fresh install with nothing saying why)
        with progress.step("loading the search kernels (compiled once per install)"):
            arena._load_kernels()
    with progress.step(f"planning {len(problem.buffers)} buffers ({mode} mode)"):
        if hasattr(arena, "plan_arena"):
            kwargs = {"mode": mode}
            if time_limit is not None:
                kwargs["time_limit"] = time_limit
            return arena.plan_arena(problem.buffers, **kwargs)
        plan = arena.choose(problem.buffers)
        if not plan.lower_bound:
            from .bounds import peak_live_bytes

            plan.lower_bound = int(peak_live_bytes(problem.buffers))
            plan.optimal = plan.height == plan.lower_bound
        return plan


# -- commands -----------------------------------------------------------------

def cmd_analyze(args, progress: Progress) -> int:
    if _is_problem(args.model):
        if args.html:
            from .errors import ModelFileError

            raise ModelFileError(f"--html: the memory page is drawn for a saved program, "
                                 f"not for an interval problem ({args.model})")
        return _analyze_problem(args)
    from .api import analyze
    from .paddle.flags import runtime_model

    _check_html_output(args)
    loaded = _load(args.model, progress)   # (the report notes several -1 dims itself)
    with _guard(loaded), progress.step("analysing"):
        runtime = runtime_model(loaded.ir)
        runtime = dataclasses.replace(runtime, loop_iterations=args.loop_iterations)
        result = analyze(loaded.program, args.batch_size, runtime=runtime)
    b = result.batch_for(args.batch_size)
    if args.json:
        doc = result.to_json(b, top=args.top)
        doc["model"] = loaded.path
        doc["ir"] = loaded.ir
        if args.budget is not None:
            doc["budget_bytes"] = args.budget
            doc["max_batch_size"] = result.max_batch_size(args.budget)
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(f"{loaded.path} ({loaded.ir} program)")
        print(result.report(b, top=args.top, budget_bytes=args.budget))
    if args.html:
        with progress.step(f"writing {args.html}"):
            result.to_html(args.html, b, title=f"{os.path.basename(loaded.path)}: memory of "
                                               f"one step, batch {b}")
        print(f"wrote {args.html}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _check_html_output(args) -> None:
    """``--html PATH``: an .html file that can be written and is no input."""
    if not getattr(args, "html", None):
        return
    from .cli_paths import check_output
    from .errors import ModelFileError

    if os.path.splitext(args.html)[1].lower() not in (".html", ".htm"):
        raise ModelFileError(f"--html {args.html}: the memory page is an HTML file; give "
                             "a path ending in .html")
    check_output(args.html, [args.model], flag="--html")


def _write_rewrite_page(args, loaded, report, released, progress: Progress) -> None:
    """``optimize --html``: the program before and after memory_optimize (and
    release_memory with --release) on one x axis."""
    if released is None:
        with progress.step(f"writing {args.html}"):
            report.to_html(args.html, title=f"{os.path.basename(loaded.path)}: memory of one "
                                            f"step before and after {report.what()}")
        return
    from .api import analyze

    if len(report.analyses) < 2:
        report.to_html(args.html)  # says why there is no page
    before, after = report.analyses
    with _guard(loaded), progress.step("analysing the released program"):
        freed = analyze(loaded.program, report.batch_size, fetch_list=list(args.fetch or []))
    with progress.step(f"writing {args.html}"):
        before.to_html(args.html, report.batch_size, compare=[after, freed],
                       labels=["before", f"after {report.what()}", "and release_memory"],
                       title=f"{os.path.basename(loaded.path)}: memory of one step before and "
                             f"after {report.what()} and release_memory")


def cmd_estimate(args, progress: Progress) -> int:
    from .api import estimate
    from .parallel import Strategy

    strategy = Strategy(dp=args.dp, tp=args.tp, pp=args.pp, sharding_stage=args.sharding_stage,
                        micro_batch_size=args.micro_batch_size, recompute=args.recompute,
                        recompute_segments=args.recompute_segments,
                        gradient_merge_steps=args.gradient_merge_steps,
                        fused_gradients=args.fused_gradients)
    try:  # before the model is read: the batch must split over the ranks
        strategy.micro_batch(args.batch_size)
    except ValueError as exc:
        raise ValueError(_as_flags(str(exc))) from None
    _check_html_output(args)
    loaded = _load(args.model, progress)
    _note_dynamic_dims(loaded)
    with _guard(loaded), progress.step("estimating"):
        result = estimate(loaded.program, strategy, args.batch_size)
    if args.json:
        doc = result.to_json()
        doc["model"] = loaded.path
        doc["ir"] = loaded.ir
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(f"{loaded.path} ({loaded.ir} program)")
        print(result)
    if args.html:
        with progress.step(f"writing {args.html}"):
            result.to_html(args.html)
        print(f"wrote {args.html}", file=sys.stderr if args.json else sys.stdout)
    return 0


#: The API's names in :mod:`memopt.parallel`'s messages -> the flags that set them.
_FLAG_OF = {"batch_size": "-b", "micro_batch_size": "--micro-batch-size",
            "gradient_merge_steps": "--gradient-merge-steps", "dp": "--dp"}


def _as_flags(message: str) -> str:
    """``message`` with :mod:`memopt.parallel`'s parameter names spelled as
    the ``estimate`` flags that set them."""
    return re.sub(r"\b(" + "|".join(_FLAG_OF) + r")\b", lambda m: _FLAG_OF[m.group(1)],
                  message)


def _analyze_problem(args) -> int:
    from .report import format_bytes
    from .bounds import peak_live_bytes, whole_buffer_lower_bound

    problem = _read_problem(args.model)
    b = args.batch_size
    doc = {
        "problem": args.model, "buffers": len(problem.buffers),
        "horizon": max((buf.upper for buf in problem.buffers), default=0),
        "peak_live_bytes": int(peak_live_bytes(problem.buffers, b)),
        "whole_buffer_lower_bound": int(whole_buffer_lower_bound(problem.buffers, b)),
        "capacity": problem.capacity,
    }
    # --budget: the capacity to check against (it was silently ignored here)
    capacity = args.budget if args.budget is not None else problem.capacity
    if capacity:
        doc["budget_bytes" if args.budget is not None else "capacity"] = capacity
        doc["fits_lower_bound"] = doc["peak_live_bytes"] <= capacity
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(f"{args.model}: {doc['buffers']} buffers over {doc['horizon']} time steps")
        print(f"  peak live bytes (no arena can be lower)  {format_bytes(doc['peak_live_bytes'])}")
        print(f"  whole-buffer reuse lower bound           "
              f"{format_bytes(doc['whole_buffer_lower_bound'])} (sharing whole buffers only, "
              "as memory_optimize does; an arena with offsets can be lower)")
        if capacity:
            what = "budget" if args.budget is not None else "capacity"
            verdict = ("no plan fits: more bytes are live at once"
                       if not doc["fits_lower_bound"] else
                       "may fit: `memopt plan` finds an arena and says whether it does")
            print(f"  {what:<41}{format_bytes(capacity)}: {verdict}")
    return 0


class _option_names:
    """Say ``--skip`` / ``--fetch`` where the library's ValueError says
    ``skip_opt_set`` / ``fetch_list`` (an unknown name); for a PIR program,
    say how its values are named (a legacy name such as ``softmax_0.tmp_0``
    is not one)."""

    def __init__(self, ir: str = "") -> None:
        self.ir = ir

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, ValueError) and not isinstance(exc, MemoptError) and exc.args:
            text = str(exc.args[0])
            for api, flag in (("skip_opt_set", "--skip"), ("fetch_list", "--fetch")):
                if text.startswith(api + " has"):
                    text = flag + text[len(api):]
                    text = text.replace("Pass names (or Variables) of this program",
                                        f"Pass {flag} names the saved program has")
                    if self.ir == "pir":
                        text += ("; a PIR program names its values %N (data and parameters "
                                 "by name) as `memopt analyze` and print(program) show them")
                    raise ValueError(text) from None
        return False


def cmd_optimize(args, progress: Progress) -> int:
    from .api import memory_optimize, release_memory
    from .cli_paths import check_output, copy_parameters, parameter_files
    from .paddle.modelio import FLUID_PROGRAM, output_path, save_program

    _check_html_output(args)
    loaded = _load(args.model, progress)
    output = output_path(loaded.ir, args.output)
    check_output(output, [loaded.path] + [p for _, p in parameter_files(loaded.path)])
    released = None
    skip, fetch = list(args.skip or []), list(args.fetch or [])
    with _guard(loaded), _option_names(loaded.ir):
        with progress.step("optimizing"):
            report = memory_optimize(loaded.program, skip_opt_set=skip,
                                     skip_grads=not args.keep_grads, level=args.level,
                                     fetch_list=fetch, budget=args.budget,
                                     batch_size=args.batch_size)
        if args.release:
            with progress.step("releasing"):
                released = release_memory(loaded.program, skip_opt_set=skip,
                                          fetch_list=fetch)
        with progress.step(f"writing {output}"):
            written = save_program(loaded.program, output)
            copied = copy_parameters(loaded.path, written)
        note = None
        if loaded.ir == "pir":
            from .paddle.pir.deploy import predictor_note

            note = predictor_note(loaded.program)
        else:
            from .paddle.legacy.deploy import predictor_note

            note = predictor_note(loaded.program)
    if os.path.basename(loaded.path) == FLUID_PROGRAM:
        print(f"memopt: note: the parameters stay in {os.path.dirname(loaded.path)} "
              "(paddle.static.load_vars reads them into the written program)", file=sys.stderr)
    if note:
        print(f"memopt: warning: {note}", file=sys.stderr)
    if args.json:
        doc = report.to_dict()
        doc["model"], doc["output"] = loaded.path, written
        doc["parameter_files"] = copied
        if note:
            doc["warning"] = note
        if released is not None:
            doc["release_memory"] = released.to_dict()
        print(json.dumps(doc, indent=2))
    else:
        print(report)
        if released is not None:
            print(released)
        print(f"wrote {written}" + (f" (parameters copied: {', '.join(copied)})"
                                    if copied else ""))
    if args.html:
        _write_rewrite_page(args, loaded, report, released, progress)
        print(f"wrote {args.html}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_plan(args, progress: Progress) -> int:
    from .report import format_bytes

    problem = _read_problem(args.problem)
    if args.output:
        from .cli_paths import check_output

        check_output(args.output, [args.problem])
    plan = _plan_problem(problem, args.exact, args.time_limit, progress)
    if args.output:
        _write_offsets(problem, plan, args.output)
    bound = getattr(plan, "lower_bound", None)
    doc = {
        "problem": args.problem, "buffers": len(problem.buffers), "height": int(plan.height),
        "lower_bound": None if bound is None else int(bound),
        "optimal": bool(getattr(plan, "optimal", False)), "strategy": plan.strategy,
        "seconds": round(float(getattr(plan, "seconds", 0.0)), 4),
        "fits_capacity": None if not problem.capacity else bool(plan.height <= problem.capacity),
        "output": args.output,
    }
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        gap = f" ({(plan.height / bound - 1) * 100:.2f}% above)" if bound else ""
        print(f"{args.problem}: {len(problem.buffers)} buffers")
        print(f"  arena height  {plan.height:,} B ({format_bytes(plan.height)}){gap}")
        if bound is not None:
            print(f"  lower bound   {bound:,} B"
                  + ("  -- proven optimal" if doc["optimal"] else ""))
        if problem.capacity:
            print(f"  capacity      {problem.capacity:,} B: "
                  + ("fits" if doc["fits_capacity"] else "does NOT fit"))
        print(f"  strategy      {plan.strategy}, {doc['seconds']:.3f} s")
        if args.output:
            print(f"wrote {args.output}")
    return 0


def _write_offsets(problem, plan, path: str) -> None:
    from .errors import ModelFileError
    from .problems import size_at

    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write("id,lower,upper,size,offset\n")
            for buf in problem.buffers:
                f.write(f"{buf.id},{buf.lower},{buf.upper},{size_at(buf.size)},"
                        f"{plan.offsets[buf.id]}\n")
    except OSError as exc:
        raise ModelFileError(f"cannot write {path}: {exc.strerror or exc}") from None


#: What ``memopt plot -o`` writes (matplotlib picks the format by extension).
PLOT_FORMATS = (".png", ".svg", ".pdf")


def _check_plot_output(args) -> None:
    from .cli_paths import check_output
    from .errors import ModelFileError

    ext = os.path.splitext(args.output)[1].lower()
    if ext not in PLOT_FORMATS:
        raise ModelFileError(f"-o {args.output}: a plot is written as "
                             f"{', '.join(PLOT_FORMATS)}; give one of those extensions")
    check_output(args.output, [args.model])


def cmd_plot(args, progress: Progress) -> int:
    from . import plot

    _check_plot_output(args)
    if _is_problem(args.model):
        from .bounds import peak_live_bytes

        problem = _read_problem(args.model)
        plan = _plan_problem(problem, args.exact, args.time_limit, progress)
        with progress.step(f"drawing {args.output}"):
            plot.plot_arena(problem.buffers, plan.offsets, args.output,
                            lower_bound=int(peak_live_bytes(problem.buffers)),
                            title=f"{os.path.basename(args.model)}: {len(problem.buffers)} "
                                  f"buffers, {plan.strategy}")
        print(f"wrote {args.output}")
        return 0
    from .report import format_bytes
    from .api import analyze, memory_optimize

    loaded = _load(args.model, progress)
    _note_dynamic_dims(loaded)
    with _guard(loaded):
        with progress.step("analysing"):
            before = analyze(loaded.program, args.batch_size)
        with progress.step("optimizing"):
            report = memory_optimize(loaded.program, level=args.level)
        with progress.step("analysing the optimized program"):
            after = analyze(loaded.program, args.batch_size)
    b = before.batch_for(args.batch_size)
    with progress.step(f"drawing {args.output}"):
        plot.plot_timeline([before, after], args.output,
                           labels=["before", f"after memory_optimize (level {args.level})"],
                           batch_size=b, top=args.top,
                           title=f"{os.path.basename(loaded.path)}: live memory over one step, "
                                 f"batch {b}")
    print(f"peak at batch {b}: {format_bytes(before.peak(b))} before, "
          f"{format_bytes(after.peak(b))} after memory_optimize "
          f"({report.merged_count} variable{'' if report.merged_count == 1 else 's'} "
          "share memory)")
    print(f"wrote {args.output}")
    return 0


# -- the parser -----------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memopt",
        description="Where a Paddle program's memory goes, and less of it: memory "
                    "analysis, memory_optimize, arena planning.",
        epilog="MODEL: a saved Paddle program (.pdmodel legacy, .json PIR, the prefix "
               "given to the save, or a directory holding __model__).  Exit codes: 0 ok, "
               "1 user error, 2 usage.")
    # --debug / --quiet go before or after the command
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks and debug logging")
    common.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS,
                        help="no progress on stderr")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks and debug logging")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"memopt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "analyze", parents=[common],
        help="peak memory, who holds it, what batch size fits",
        description="Model one training/inference step of a saved program as "
            "Paddle's executor runs it and report the peak of live "
            "memory, the variables holding it, the peak as a function "
            "of the batch size and, with --budget, the largest batch "
            "that fits.  A .csv interval problem gets its lower bounds.")
    p.add_argument("model", metavar="MODEL", help="saved program (.pdmodel/.json) or .csv problem")
    p.add_argument("--batch-size", "-b", type=_positive_int, default=None,
                   help="batch size for the -1 dimensions (default 1)")
    p.add_argument("--budget", type=_bytes_arg, default=None, metavar="BYTES",
                   help="memory budget, e.g. 16GiB, 512MiB, 2GB: report the largest batch size "
                        "that fits (parameters included)")
    p.add_argument("--top", type=_positive_int, default=5, help="holders to list (default 5)")
    p.add_argument("--loop-iterations", type=_positive_int, default=1, metavar="N",
                   help="iterations of while loops, for what a training loop saves for its "
                        "backward pass (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--html", metavar="OUT.html", default=None,
                   help="also write the interactive memory page (one self-contained HTML "
                        "file: live bytes by kind over the op sequence, hover for the op and "
                        "its largest holders, a sortable table of the holders at the peak)")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser(
        "optimize", parents=[common],
        help="memory_optimize a saved program and write it",
        description="Run memopt.memory_optimize on a saved program and write "
            "the rewritten program (legacy: .pdmodel; PIR: .json).")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--level", type=int, choices=(0, 1, 2), default=0,
                   help="0: share only same shape and dtype; 1: any provably large enough; "
                        "2: level 1 and a memory-aware op order")
    p.add_argument("--budget", type=_bytes_arg, metavar="BYTES", default=None,
                   help="recompute forward values so one training step fits this allocator "
                        "peak, e.g. 512MiB (both IRs; needs --batch-size)")
    p.add_argument("-b", "--batch-size", type=_positive_int, default=None, metavar="N",
                   help="the batch size --budget is for")
    p.add_argument("--skip", nargs="+", action="extend", metavar="NAME", default=[],
                   help="variables never to merge (repeatable)")
    p.add_argument("--fetch", nargs="+", action="extend", metavar="NAME", default=[],
                   help="variables you will fetch from the written program: kept, and "
                        "fetchable (repeatable)")
    p.add_argument("--keep-grads", action="store_true",
                   help="let gradients take part (skip_grads=False)")
    p.add_argument("--release", action="store_true",
                   help="then release_memory: with the garbage collector off "
                        "(FLAGS_eager_delete_tensor_gb=-1) free each temporary right after "
                        "its last use (legacy programs)")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="where to write the rewritten program (.json PIR, .pdmodel legacy, or "
                        "a prefix); the parameter files beside MODEL (.pdiparams, .pdparams, "
                        ".pdopt) are copied beside it.  Never MODEL itself")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--html", metavar="OUT.html", default=None,
                   help="also write the memory page of the program before and after (one "
                        "x axis: the original program's op positions)")
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser(
        "estimate", parents=[common],
        help="each rank's peak memory under a parallel strategy, before launch",
        description="Predict each rank's peak memory for a saved one-device training "
            "program under a parallel strategy (data/tensor/pipeline parallel degrees, "
            "sharding stage, micro-batch, recompute, gradient merge): parameters, "
            "gradients, optimizer state, activations (from analyze), communication "
            "buffers.  A program already rewritten for one rank (it has communication "
            "ops) is estimated as it is.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--batch-size", "-b", type=_positive_int, required=True,
                   help="global batch size (all ranks, one optimizer step)")
    p.add_argument("--dp", type=_positive_int, default=1, help="data parallel degree")
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor parallel degree")
    p.add_argument("--pp", type=_positive_int, default=1, help="pipeline parallel degree")
    p.add_argument("--sharding-stage", type=int, choices=(0, 1, 2, 3), default=0)
    p.add_argument("--micro-batch-size", type=_positive_int, default=None,
                   help="samples a rank runs at once (default batch / (dp * merge steps))")
    p.add_argument("--recompute", action="store_true", help="recompute activations")
    p.add_argument("--recompute-segments", type=_positive_int, default=4, metavar="K")
    p.add_argument("--gradient-merge-steps", type=_positive_int, default=1, metavar="K")
    p.add_argument("--fused-gradients", action="store_true",
                   help="gradients in one fused buffer (fuse_all_reduce_ops)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--html", metavar="OUT.html", default=None,
                   help="also write the memory page: one lane per rank (the step it runs)")
    p.set_defaults(func=cmd_estimate)

    p = sub.add_parser(
        "plan", parents=[common],
        help="plan arena offsets for an interval problem (.csv)",
        description="Give every buffer of an interval problem (CSV "
            "id,lower,upper,size) an offset in one arena.")
    p.add_argument("problem", metavar="PROBLEM.csv")
    p.add_argument("--exact", action="store_true",
                   help="search until the plan is proven optimal or the time limit")
    p.add_argument("--time-limit", type=_positive_float, default=None, metavar="S",
                   help="seconds the search may take")
    p.add_argument("-o", "--output", default=None, metavar="OUT.csv",
                   help="write id,lower,upper,size,offset")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "plot", parents=[common],
        help="draw a program's memory timeline or an arena plan",
        description="MODEL: live memory over the op sequence before and after "
            "memory_optimize, the peaks marked, the top holders named.  "
            "PROBLEM.csv: the arena plan, buffers as rectangles.")
    p.add_argument("model", metavar="MODEL|PROBLEM.csv")
    p.add_argument("-o", "--output", required=True, metavar="PNG",
                   help="the image to write: .png, .svg or .pdf")
    p.add_argument("--batch-size", "-b", type=_positive_int, default=None)
    p.add_argument("--level", type=int, choices=(0, 1), default=0,
                   help="memory_optimize level for the 'after' line")
    p.add_argument("--top", type=_positive_int, default=5, help="holders to name")
    p.add_argument("--exact", action="store_true", help="(problems) exact arena search")
    p.add_argument("--time-limit", type=_positive_float, default=None, metavar="S")
    p.set_defaults(func=cmd_plot)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on a usage error
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="memopt: %(levelname)s %(name)s: %(message)s")
    if not args.debug:
        os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ info lines
        warnings.filterwarnings("ignore", category=UserWarning)
    progress = Progress(enabled=not args.quiet)
    try:
        return int(args.func(args, progress) or 0)
    except (MemoptError, ValueError, OSError) as exc:
        if args.debug:
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"memopt: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("memopt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # python -m memopt.cli
    sys.exit(main())
