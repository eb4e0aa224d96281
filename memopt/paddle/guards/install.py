"""One call that puts in every fetch-time check of the adapters.

:func:`install_fetch_guard` hooks ``Executor.run`` (and PIR
``save_inference_model``) so that a fetch of a variable memory_optimize /
release_memory renamed away, or of a Value an in-place op of theirs writes
over, raises :class:`memopt.errors.MergedVariableError` -- in any process,
for programs loaded from files too (the record travels in the program).
memopt's own calls put it in; ``memopt.install_fetch_guard()`` does it in a
process that only loads rewritten programs.  Without it a legacy fetch
still fails (Paddle's own error naming the variable), only less helpfully;
a PIR fetch of an overwritten Value does not fail (Paddle's executor checks
nothing a saved program could carry: see :mod:`memopt.paddle.pir.rewrite`).
Imports Paddle.
"""
from __future__ import annotations

__all__ = ["install_fetch_guard"]


def install_fetch_guard() -> None:
    """Hook Paddle's executor once per process (idempotent)."""
    from ..legacy import program as legacy
    from ..pir import rewrite as pir_rewrite

    legacy.install_fetch_guard()
    pir_rewrite.install_fetch_guard()
