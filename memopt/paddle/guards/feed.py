"""Refuse a feed of a variable a rewrite of a legacy program renamed away.

Fluid users override part of a program by feeding an intermediate variable
by name (``Executor.run(feed={"fc_0.tmp_2": ...}, use_prune=True)``: Paddle
drops the ops that compute it and the rest reads the fed value).  Once
memory_optimize merged that variable into ``memopt@buf_<k>`` (or
release_memory released it) the program no longer has the name, and Paddle
feeds it to nothing: the ops run as before and the step silently computes
its own value instead of the fed one (tests/memopt/paddle/
test_training_setups.py: 3 SGD steps, every other one fed, differed from
the unchanged program from the second step on, levels 0-2 and budget=).
So ``Executor.run`` (where memopt is imported) raises
:class:`memopt.errors.MergedVariableError` naming the variable and the fix.
A name the program still declares is fed as Paddle always does: it holds
its own memory.
"""
from __future__ import annotations

from ...errors import MergedVariableError
from ..legacy import merge_record

__all__ = ["check_feed", "feed_hook"]


def feed_hook(program, feed) -> None:
    """The :mod:`memopt.paddle.guards.fetch` feed hook: :func:`check_feed`
    for a legacy program, nothing for any other."""
    from ..legacy.program import is_legacy_program

    if is_legacy_program(program):
        check_feed(program, feed)


def check_feed(program, feed) -> None:
    """Raise :class:`MergedVariableError` if ``feed`` (a dict) names a
    variable a rewrite of legacy ``program`` renamed away."""
    if not isinstance(feed, dict) or not feed:
        return
    block = program.global_block()
    gone = [n for n in feed if isinstance(n, str) and not block.has_var(n)]
    if not gone:
        return
    record = merge_record.record_of(program)
    for name in gone:
        if name not in record:
            continue  # not memopt's: Paddle's own behaviour
        buf, merged, _released = record[name]
        what = (f"memopt.memory_optimize made it share memory with other variables (now "
                f"{buf!r})" if merged else
                f"memopt.release_memory renamed it to {buf!r} to free it after its last use")
        raise MergedVariableError(
            f"cannot feed {name!r}: {what}, so the program no longer has that name and Paddle "
            f"would feed the value to nothing (the ops computing it would run as before). "
            f"Rebuild the program and pass skip_opt_set={{{name!r}}} to memory_optimize / "
            f"release_memory to keep it fed by name")
