"""``paddle.pir.translate_to_pir`` refused on a legacy program memopt rewrote.

``paddle.pir.translate_to_pir(program.desc)`` (and
``translate_to_pir_with_param_map``, and ``load_inference_model`` of a
``.pdmodel`` in PIR executor mode, which calls it) builds a PIR program
from a legacy desc: each variable becomes a typed SSA value.  A desc
memopt rewrote does not translate to the program it computes: measured on
Paddle 3.3.1, an embedding-LSTM classifier rewritten with the GC on (a grad
op's dims-only read redirected, :data:`merge_record.SUBSTITUTED_VAR`) ran
translated into ``Tensor holds no memory``, and at level 1 with the GC off
(buffers ``memopt@buf_<k>`` shared by variables of other shapes) into
``The shape of input[0] and input[2] is expected to be equal``; an AMP O1
program alike.  Some rewritten programs do translate and run right, but
which is Paddle's business, not a property memopt can state; so every
rewritten desc is refused, naming why and the fix: translate the program
as built and call ``memory_optimize`` on the PIR program.

Where memopt is not imported nothing refuses, and Paddle fails as above.
"""
from __future__ import annotations

import functools

from ...errors import UnsupportedProgramError

__all__ = ["check_desc", "install"]


def check_desc(desc) -> None:
    """UnsupportedProgramError if ``desc`` (a legacy ``ProgramDesc``) holds
    a memopt rewrite: a buffer ``memopt@buf_<k>`` or a redirected read."""
    from ..legacy.merge_record import BUFFER_PREFIX, SUBSTITUTED_VAR

    try:
        names = [v.name() for b in range(desc.num_blocks()) for v in desc.block(b).all_vars()]
    except Exception:  # not a ProgramDesc: Paddle says what it wants
        return
    found = [n for n in names if n.startswith(BUFFER_PREFIX) or n == SUBSTITUTED_VAR]
    if found:
        raise UnsupportedProgramError(
            f"paddle.pir.translate_to_pir cannot translate a program memopt.memory_optimize / "
            f"release_memory rewrote (it has {found[0]!r}: variables share memory or a grad "
            f"op reads another variable's dims), the PIR program fails or computes other "
            f"values. Translate the program as built, then call memory_optimize on the PIR "
            f"program; or run this one with the legacy executor")


def _guarded(original):
    @functools.wraps(original)
    def translate(desc, *args, **kwargs):
        check_desc(desc)
        return original(desc, *args, **kwargs)

    translate.__memopt_original__ = original
    return translate


def install() -> None:
    """Wrap ``paddle.pir.translate_to_pir`` and
    ``translate_to_pir_with_param_map`` (once per process)."""
    import paddle.pir

    for name in ("translate_to_pir", "translate_to_pir_with_param_map"):
        current = getattr(paddle.pir, name, None)
        if current is not None and not hasattr(current, "__memopt_original__"):
            setattr(paddle.pir, name, _guarded(current))
