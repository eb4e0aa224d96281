"""Checks memopt hooks into Paddle so that a rewritten program cannot be
misused silently, put in by one call and taken out by one call.

What a rewrite leaves behind is safe only if Paddle is stopped from using it
wrongly, so memopt wraps five of Paddle's functions:

- ``Executor.run`` (:mod:`.fetch`): a fetch of a variable a rewrite merged
  or released away, or of a PIR Value an in-place op writes over, raises
  :class:`memopt.errors.MergedVariableError`; so does a feed of a renamed
  variable (:mod:`.feed`), and a ``CompiledProgram`` whose fusion passes
  miscompute on a shared buffer is refused (:mod:`.compiled`);
- ``paddle.static.io.normalize_program`` and PIR's
  ``save_inference_model_pir`` (:mod:`.fetch`): saving a merged target
  raises, and a saved PIR model gets the ops as built and the record;
- ``Block.var`` (:mod:`.lookup`): a lookup by name of a variable renamed
  before the backward says why;
- ``paddle.pir.translate_to_pir`` (:mod:`.translate`): a rewritten legacy
  desc is refused.

:func:`install` puts them in (idempotent; memopt's own rewrites call
:func:`install_legacy` / :func:`install_pir`, and loading a saved model
calls :func:`install`); :func:`uninstall` gives Paddle back the very
functions it had and forgets every hook.  Each wrapper keeps what it wraps
as ``__memopt_original__``.  Importing this package does not import Paddle.
"""
from __future__ import annotations

__all__ = ["install", "install_legacy", "install_pir", "installed", "uninstall",
           "install_fetch_guard"]

#: ``(module path, owner attribute or None, function name)`` of every Paddle
#: function a guard wraps.
WRAPPED = (
    ("paddle.base.executor", "Executor", "run"),
    ("paddle.base.framework", "Block", "var"),
    ("paddle.static.io", None, "normalize_program"),
    ("paddle.static", None, "normalize_program"),
    ("paddle.static.io", None, "save_inference_model_pir"),
    ("paddle.pir", None, "translate_to_pir"),
    ("paddle.pir", None, "translate_to_pir_with_param_map"),
)


def install_legacy() -> None:
    """The checks for legacy programs: fetch, feed, save (normalize),
    compiled programs, lookups by name and the translation to PIR."""
    from ..legacy import program as legacy_program
    from . import compiled, feed, fetch, lookup, translate

    fetch.add_hook(legacy_program.fetch_hook)
    fetch.add_normalize_hook(legacy_program.normalize_hook)
    fetch.add_feed_hook(feed.feed_hook)
    lookup.install()
    fetch.add_compiled_hook(compiled.check_compiled)
    translate.install()


def install_pir() -> None:
    """The checks for PIR programs: fetches resolved through the rewrite's
    record, and what ``save_inference_model`` writes."""
    from ..pir import deploy as pir_deploy
    from ..pir import rewrite as pir_rewrite
    from . import fetch

    fetch.add_hook(pir_rewrite.fetch_hook)
    fetch.add_serialize_hook(pir_deploy.out_of_place_for_save)  # the saved model: the ops as built
    fetch.add_serialize_hook(pir_rewrite.record_for_save)
    fetch.add_save_hook(pir_rewrite.check_save)


def install() -> None:
    """Every check, for both IRs (once per process; again does nothing)."""
    install_legacy()
    install_pir()


#: ``memopt.install_fetch_guard``: the public name of :func:`install`.
install_fetch_guard = install


def _owner(module: str, owner):
    import importlib

    mod = importlib.import_module(module)
    return getattr(mod, owner) if owner else mod


def installed() -> bool:
    """Whether any of Paddle's functions is wrapped by a guard now."""
    for module, owner, name in WRAPPED:
        fn = getattr(_owner(module, owner), name, None)
        if hasattr(fn, "__memopt_original__"):
            return True
    return False


def uninstall() -> None:
    """Give Paddle back each function a guard wrapped (the very object it
    had before :func:`install`) and forget every hook; without a guard
    in, nothing changes.  A rewritten program run afterwards fails as
    Paddle makes it fail (by name) or, where Paddle checks nothing, runs
    unchecked: call :func:`install` again before running one."""
    from . import fetch

    for module, owner, name in WRAPPED:
        holder = _owner(module, owner)
        fn = getattr(holder, name, None)
        while hasattr(fn, "__memopt_original__"):
            fn = fn.__memopt_original__
        if fn is not None:
            setattr(holder, name, fn)
    fetch.clear_hooks()
