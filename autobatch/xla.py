"""TFP's ``auto_batching.xla``: :func:`compile_nested_output`.

XLA compilers of TensorFlow (``tf.function(jit_compile=True)``, TPU
rewrites, the older ``xla.compile``) hand back a flat list of tensors; a
function returning a nested structure (tuples, lists, dicts, namedtuples)
loses its shape.  :func:`compile_nested_output` records the structure the
function returns while it is traced and packs the compiled flat outputs back
into it.  TensorFlow is imported when the wrapper is called.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

__all__ = ["compile_nested_output", "jit_compile"]


def jit_compile(function: Callable[..., List[Any]], inputs: Sequence[Any]) -> List[Any]:
    """Run ``function(*inputs)`` compiled by XLA (``tf.function(jit_compile=True)``):
    the default ``compile_fn`` of :func:`compile_nested_output`."""
    import tensorflow as tf
    return tf.function(function, jit_compile=True, autograph=False)(*inputs)


def compile_nested_output(f: Callable[..., Any],
                          compile_fn: Optional[Callable[..., Any]] = None
                          ) -> Callable[..., Any]:
    """``f`` wrapped so that ``compile_fn`` compiles it and its nested result
    comes back nested.

    Parameters
    ----------
    f : takes (possibly nested) inputs, returns a (possibly nested) result
        of tensors.
    compile_fn : ``compile_fn(flat_function, inputs)`` compiles and runs
        ``flat_function(*inputs)``, which returns the flat list of ``f``'s
        result (TFP's: ``xla.compile`` or ``tpu.rewrite``).  Default
        :func:`jit_compile` (TFP's has no default).

    Returns
    -------
    A function of the same inputs as ``f`` whose result has ``f``'s
    structure, each tensor computed by the compiled function.

    Raises
    ------
    ValueError : ``compile_fn`` returned without tracing ``f`` (so the
        structure is unknown).
    """
    compile_fn = jit_compile if compile_fn is None else compile_fn

    def compiled(*inputs: Any) -> Any:
        import tensorflow as tf
        structure: List[Any] = []

        def flat(*args: Any) -> List[Any]:
            result = f(*args)
            leaves = tf.nest.flatten(result)
            structure[:] = [tf.nest.pack_sequence_as(result, [0] * len(leaves))]
            return leaves
        outputs = compile_fn(flat, inputs)
        if not structure:
            raise ValueError(f"compile_nested_output: compile_fn {compile_fn!r} returned "
                             f"without calling the function, so its output structure is "
                             f"unknown; compile_fn(fn, inputs) must trace fn(*inputs)")
        return tf.nest.pack_sequence_as(structure[0], tf.nest.flatten(outputs))
    return compiled
