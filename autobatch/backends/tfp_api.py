"""TFP's backend API on autobatch's backends.

Code written against ``tfp.experimental.auto_batching``'s backends
(``numpy_backend.NumpyBackend``, ``tf_backend.TensorFlowBackend``) calls
methods some of which autobatch's backends also have, with other argument
lists.  Both lists are accepted:

==================  ==========================================  ==============================
method              autobatch's (the VM's)                      TFP's
==================  ==========================================  ==============================
``fill``            ``(tensor_type, batch_size, value=0)``      ``(value, size, dtype, shape,
                                                                name=None)``
``type_of``         ``(value, batch_size)``: per-thread type    ``(t, dtype_hint=None)``: the
                                                                whole shape of ``t``
``while_loop``      ``(cond, body, state)``, ``state`` a dict   ``(cond, body, loop_vars,
                                                                name=None)``, a list
                                                                unpacked into cond and body
``switch_case``     ``(index, branches, state)``: branches      ``(branch_selector,
                    take and return the state                   branch_callables, name=None)``:
                                                                callables take nothing
==================  ==========================================  ==============================

:func:`accept_tfp_arguments` wraps a backend class's own definitions of
these four so that a call in TFP's form goes to the ``tfp_*`` method of
:class:`TfpMethods` (which a backend may override: TensorFlow's builds
``tf.while_loop``/``tf.switch_case`` inside graphs), and a call in autobatch's
form to the backend's method unchanged.  :class:`TfpMethods` also has TFP's
methods autobatch's VM does not use (``batch_size``, ``cond``, ``equal``,
``not_equal``, ``any``, ``broadcast_to_shape_of``, ``static_value``,
``assert_matching_dtype``, ``prepare_for_cond``,
``wrap_straightline_callable``, ``variable_class``), in NumPy.
"""
from __future__ import annotations

import functools
import inspect
import numbers
from typing import Any, Callable, Sequence

import numpy as np

from autobatch.ir import TensorType

__all__ = ["TfpMethods", "accept_tfp_arguments", "WRAPPED"]

#: The methods taking either argument list.
WRAPPED = ("fill", "type_of", "while_loop", "switch_case")


def _is_tfp_fill(args: Sequence[Any], kwargs: dict) -> bool:
    first = args[0] if args else kwargs.get("tensor_type", kwargs.get("value"))
    return not isinstance(first, TensorType) and "tensor_type" not in kwargs


def _is_tfp_type_of(args: Sequence[Any], kwargs: dict) -> bool:
    if "dtype_hint" in kwargs:
        return True
    if "batch_size" in kwargs:
        return False
    second = args[1] if len(args) > 1 else None
    return not (isinstance(second, numbers.Integral) and not isinstance(second, bool))


def _is_tfp_loop(args: Sequence[Any], kwargs: dict) -> bool:
    third = args[2] if len(args) > 2 else kwargs.get("loop_vars", kwargs.get("state"))
    return "loop_vars" in kwargs or isinstance(third, (list, tuple))


def _is_tfp_switch(args: Sequence[Any], kwargs: dict) -> bool:
    third = args[2] if len(args) > 2 else kwargs.get("state")
    return "state" not in kwargs and (third is None or isinstance(third, str))


_TESTS = {"fill": _is_tfp_fill, "type_of": _is_tfp_type_of,
          "while_loop": _is_tfp_loop, "switch_case": _is_tfp_switch}


def _dispatching(name: str, own: Callable[..., Any]) -> Callable[..., Any]:
    test = _TESTS[name]

    @functools.wraps(own)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if test(args, kwargs):
            return getattr(self, "tfp_" + name)(*args, **kwargs)
        return own(self, *args, **kwargs)

    method.__wrapped_for_tfp__ = True
    # TFP's argument list, for scripts/check_tfp_api.py (without ``self``).
    tfp_sig = inspect.signature(getattr(TfpMethods, "tfp_" + name))
    method.__tfp_signature__ = tfp_sig.replace(
        parameters=list(tfp_sig.parameters.values())[1:])
    return method


def accept_tfp_arguments(cls: type) -> None:
    """Wrap the methods of :data:`WRAPPED` that ``cls`` itself defines (see
    the module doc); called for every backend class when it is made."""
    for name in WRAPPED:
        own = cls.__dict__.get(name)
        if own is not None and callable(own) and not getattr(own, "__wrapped_for_tfp__", False):
            setattr(cls, name, _dispatching(name, own))


class TfpMethods:
    """TFP's backend methods (NumPy versions; see the module doc)."""

    # -- TFP's argument lists of the shared methods -------------------------------------
    def tfp_fill(self, value: Any, size: Any, dtype: Any, shape: Any, name: Any = None) -> Any:
        """``[size, *shape]`` of ``dtype`` filled with ``value`` (TFP's ``fill``)."""
        return self.fill(TensorType(dtype, tuple(int(d) for d in shape)), size, value)

    def tfp_type_of(self, t: Any, dtype_hint: Any = None) -> TensorType:
        """TFP's ``type_of``: the dtype and the *whole* shape of ``t`` (batch
        dimension included), a constant taking ``dtype_hint``."""
        array = np.asarray(t, dtype=dtype_hint)
        return TensorType(array.dtype, array.shape)

    def tfp_while_loop(self, cond: Callable[..., Any], body: Callable[..., Any],
                       loop_vars: Sequence[Any], name: Any = None) -> Any:
        """``while cond(*loop_vars): loop_vars = body(*loop_vars)``."""
        while cond(*loop_vars):
            loop_vars = body(*loop_vars)
        return loop_vars

    def tfp_switch_case(self, branch_selector: Any, branch_callables: Sequence[Callable[[], Any]],
                        name: Any = None) -> Any:
        """``branch_callables[branch_selector]()``."""
        return branch_callables[int(branch_selector)]()

    # -- TFP's other methods ------------------------------------------------------------
    @property
    def variable_class(self) -> tuple:
        """The classes of the variable objects ``create_variable`` makes."""
        from autobatch.backends import variables as v
        return (v.NullVariable, v.TemporaryVariable, v.RegisterVariable, v.FullVariable)

    def executes_eagerly(self) -> bool:
        """Whether values are computed now (True), not staged into a graph."""
        return True

    def batch_size(self, val: Any, name: Any = None) -> Any:
        """The leading (batch) dimension of ``val``; 1 for a scalar."""
        shape = np.shape(val)
        return int(shape[0]) if shape else 1

    def static_value(self, t: Any) -> Any:
        """``t``'s value now (None where it is staged into a graph)."""
        return np.asarray(t)

    def assert_matching_dtype(self, expected_dtype: Any, val: Any, message: str = "") -> None:
        """ValueError unless ``val`` (converted with ``expected_dtype`` as
        the hint for a constant) has dtype ``expected_dtype``."""
        found = self.tfp_type_of(val, None).dtype if hasattr(val, "dtype") else \
            np.asarray(val, dtype=expected_dtype).dtype
        if np.dtype(found) != np.dtype(expected_dtype):
            raise ValueError(f"Mismatched dtype: expected {np.dtype(expected_dtype)} found "
                             f"{np.dtype(found)}. {message}")

    def broadcast_to_shape_of(self, val: Any, target: Any, name: Any = None) -> Any:
        """``val`` broadcast to ``target``'s shape (and dtype, for a constant)."""
        target = np.asarray(target)
        dtype = getattr(val, "dtype", target.dtype)
        return np.broadcast_to(np.asarray(val, dtype=dtype), target.shape).copy()

    def cond(self, pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any],
             name: Any = None) -> Any:
        """``true_fn()`` if ``pred`` else ``false_fn()``."""
        return true_fn() if bool(pred) else false_fn()

    def prepare_for_cond(self, state: Any) -> Any:
        """TFP's hook before a cond tree: nothing to do here."""
        return state

    def equal(self, t1: Any, t2: Any, name: Any = None) -> Any:
        return np.equal(t1, t2)

    def not_equal(self, t1: Any, t2: Any, name: Any = None) -> Any:
        return np.not_equal(t1, t2)

    def any(self, t: Any, name: Any = None) -> Any:
        return np.any(t)

    def wrap_straightline_callable(self, f: Callable[..., Any]) -> Callable[..., Any]:
        """TFP's hook to compile a block's code: ``f`` unchanged."""
        return f
