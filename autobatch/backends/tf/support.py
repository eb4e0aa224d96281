"""What the TensorFlow backend's parts share: settings, error codes of
checks that fail inside graphs, and small facts about graphs, variables and
dtypes."""
from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.ops import resource_variable_ops

from autobatch.backends.base import MAX_CHAIN

#: The ways the VM can run on TensorFlow.
MODES = ("eager", "graph", "xla")
#: How threads at a block are picked: gather their rows, mask every row, or
#: (XLA) pack them into the smallest of a few static bucket sizes.
SELECTIONS = ("gather", "mask", "bucket", "auto")

#: Extra stack frames of gathering backends (see TensorFlowBackend.stack):
#: one per call a VM step can make after its overflow check failed.
SPARE_FRAMES = MAX_CHAIN + 1

#: XLA runs of scalar programs over at least this many threads pack the
#: running threads into a PHASE_DIVISOR-th of the batch once few enough run.
PHASE_MIN_BATCH = 4096
PHASE_DIVISOR = 8

#: Loop-state key of the error code (0: no failed check).
ERROR_KEY = "__error"

# The errors of failed checks inside graphs, by code (index + 1).  Shared by
# every backend object, because block code traced with one backend may be
# reused (through a block_code_cache) by an equal one.
_ERROR_MAKERS: List[Callable[[], Exception]] = []
_TRACE_COUNTS: Dict[Tuple[Any, ...], int] = {}
_ERROR_CODES: Dict[int, int] = {}


def _error_code(make_error: Callable[[], Exception]) -> int:
    code = _ERROR_CODES.get(id(make_error))
    if code is None or _ERROR_MAKERS[code - 1] is not make_error:
        _ERROR_MAKERS.append(make_error)
        code = len(_ERROR_MAKERS)
        _ERROR_CODES[id(make_error)] = code
    return code


def raise_for_error_code(code: int) -> None:
    """Raise the error of a failed check whose ``code`` a graph run returned
    (nothing for 0)."""
    code = int(code)
    if code:
        raise _ERROR_MAKERS[code - 1]()


_ANONYMOUS = context.anonymous_name()


def _run_as_function(outputs: Any, op_types: Tuple[str, ...]) -> None:
    """Keep the control-flow op that made ``outputs`` a function call.

    TensorFlow lowers a ``Case`` in a graph to switch/merge nodes, so every
    step walks (as dead nodes) the code of every block; called as a function
    it runs only the chosen block: fewer nodes per step (measured 20-40%
    faster on fib).  Uses the private lowering attribute; where the graph's
    structure is not as expected, nothing is changed.
    """
    from tensorflow.core.framework import attr_value_pb2
    flat = [t for t in tf.nest.flatten(outputs) if tf.is_tensor(t)]
    op = flat[0].op if flat else None
    for _ in range(8):
        if op is None or op.type in op_types:
            break
        op = op.inputs[0].op if op.inputs else None
    if op is not None and op.type in op_types:
        op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))


def _in_xla_context(graph: Any) -> bool:
    """Whether ``graph`` (or a graph it is nested in) is being built for XLA
    (a ``tf.function(jit_compile=True)``)."""
    from tensorflow.python.ops import control_flow_util
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def _leave_autobatch_to_python() -> None:
    """AutoGraph (``tf.function``'s default) calls autobatch's own code as
    Python, unconverted, as TensorFlow's rules already do for TFP's
    (``DoNotConvert('tensorflow_probability')``): a batched function first
    called inside a ``tf.function`` was converted and failed while compiling
    (TypeError ``tf__fibonacci() missing 1 required positional argument``).
    The user's functions are still run by autobatch, which batches them."""
    from tensorflow.python.autograph.core import config
    if not any(isinstance(rule, config.DoNotConvert) and getattr(rule, "_prefix", None)
               == "autobatch" for rule in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (config.DoNotConvert("autobatch"),) + \
            tuple(config.CONVERSION_RULES)


_leave_autobatch_to_python()


def _legacy_graph(graph: Any) -> bool:
    """Whether ``graph`` is built as TF1 code (a ``tf.compat.v1.Graph``, not
    a function), where ``==`` on tensors compares identity."""
    return not tf.executing_eagerly() and not getattr(graph, "building_function", False) \
        and not tf.compat.v1.executing_eagerly_outside_functions()


def _is_variable(value: Any) -> bool:
    return tf.is_tensor(value) and value.dtype == tf.resource


def _variable_dtype(handle: tf.Tensor) -> tf.DType:
    data = resource_variable_ops.get_eager_safe_handle_data(handle)
    return tf.as_dtype(data.shape_and_type[0].dtype)


def _storage_shape(array: Any) -> Tuple[Optional[int], ...]:
    """The static shape of a storage array or of the variable holding it."""
    if _is_variable(array):
        data = resource_variable_ops.get_eager_safe_handle_data(array)
        return tuple(tf.TensorShape(data.shape_and_type[0].shape).as_list())
    return tuple(array.shape.as_list())

def _scalar_program(lowered: Any) -> bool:
    """Whether every value of the lowered program is a scalar per thread."""
    return all(not leaf.shape for typ in lowered.var_types.values() for leaf in typ.leaves())


def _tf_dtype(dtype: Any) -> tf.DType:
    return tf.as_dtype(np.dtype(dtype))


def _is_python_scalar(value: Any) -> bool:
    return isinstance(value, (bool, numbers.Number)) and not isinstance(value, np.generic)
