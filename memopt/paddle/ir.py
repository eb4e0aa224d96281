"""The IR a Paddle program is in, chosen once per call.

A Paddle static program is a legacy ``paddle.base.framework.Program`` or a
``paddle.pir.Program``; the two differ in how user arguments name values,
what must be done before and after a rewrite, and how a program is read.
:class:`IR` is what both adapters implement
(:class:`LegacyIR`, :class:`PirIR`, below);
:func:`ir_of` picks one, so the entry points (:mod:`memopt.api`) never test
which IR they hold.  Anything else gets :data:`UNKNOWN`, whose hooks change
nothing: the pipeline it is handed to refuses it by name
(:func:`memopt.policy.dispatch`), after the arguments were checked as for
any program.  Importing this module does not import Paddle.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import ContextManager, FrozenSet, Tuple

from ..graph import Graph
from ..plan import Options
from . import pending_backward
from .legacy import program as legacy_program
from .pir import inplace as pir_inplace
from .pir import owner as pir_owner
from .pir import program as pir
from .pir import retired as pir_retired
from .pir import rewrite as pir_rewrite


class IR:
    """One IR's answers to what the entry points ask of a program."""

    #: ``"legacy"``, ``"pir"`` or ``"unknown"``: the key of the IR's pipeline.
    name = "unknown"

    def owns(self, program) -> bool:
        """Whether ``program`` is a program of this IR."""
        return False

    def before_rewrite(self, program) -> None:
        """Bring ``program`` up to date before memory_optimize reads it."""

    def live_arguments(self, program, skip_opt_set, fetch_list) -> Tuple:
        """``(skip_opt_set, fetch_list)`` as the program names them now."""
        return skip_opt_set, fetch_list

    def check_own_values(self, program, skip_opt_set, fetch_list) -> None:
        """ValueError for an argument naming a value of another program."""

    def keep_for_pending_backward(self, program, options: Options
                                  ) -> Tuple[Options, FrozenSet[str]]:
        """``(options, added)``: ``options`` keeping what a backward part
        appended later would read, and the names that added."""
        return options, frozenset()

    def session(self, program) -> ContextManager:
        """The context a rewrite of ``program`` runs in (entered once per call)."""
        return contextlib.nullcontext()

    def read(self, program, fetch_names=()) -> Graph:
        """``program`` as a neutral :class:`memopt.graph.Graph`, ``fetch_names``
        fetched at the end."""
        from ..errors import UnsupportedProgramError

        raise UnsupportedProgramError(f"not a Paddle static program: {type(program).__name__}")


class LegacyIR(IR):
    """Legacy programs: variables are named by strings, a rewrite needs
    nothing before or around it, and a program whose backward is still to
    come is marked by the rewrite itself (:mod:`memopt.paddle.pending_backward`)."""

    name = "legacy"

    def owns(self, program) -> bool:
        return legacy_program.is_legacy_program(program)

    def read(self, program, fetch_names=()) -> Graph:
        """The program's graph with ``fetch_names`` fetched at the end."""
        graph = legacy_program.program_to_graph(program)
        if fetch_names:
            graph.fetch_names = tuple(dict.fromkeys((*graph.fetch_names,
                                                     *sorted(fetch_names))))
        return graph


LEGACY = LegacyIR()


class PirIR(IR):
    """PIR programs.

    - Arguments may be PIR Values: a Value an earlier rewrite replaced is
      swapped for its replacement (:mod:`memopt.paddle.pir.retired`,
      :mod:`memopt.paddle.pir.owner`), and a Value of another program refused.
    - A rewrite runs in static mode (a DistModel hands its program over in
      dygraph mode) between the marks of an earlier rewrite restored from its
      record and the record written back (:mod:`memopt.paddle.pir.rewrite`).
    - A program with trainable parameters and no backward yet keeps every
      value a backward appended later would read
      (:mod:`memopt.paddle.pending_backward`).
    """

    name = "pir"

    def owns(self, program) -> bool:
        return pir.is_pir_program(program)

    def before_rewrite(self, program) -> None:
        """Values an earlier rewrite replaced: their replacements (before any use)."""
        pir_retired.redirect(program)

    def live_arguments(self, program, skip_opt_set, fetch_list):
        return (pir_owner.live_values(program, skip_opt_set, "skip_opt_set"),
                pir_owner.live_values(program, fetch_list, "fetch_list"))

    def check_own_values(self, program, skip_opt_set, fetch_list) -> None:
        pir_owner.require_own_values(program, skip_opt_set=skip_opt_set, fetch_list=fetch_list)

    def keep_for_pending_backward(self, program, options: Options):
        """(options, kept): for a ``program`` with trainable parameters and
        no backward op yet, ``options`` with every value a backward part
        appended later would read in ``read_later`` (never written over in
        place), and the values added."""
        with pir_inplace.static_mode():
            pending = pending_backward.pending_backward_values(program)
        added = pending - options.skip_opt_set - options.fetch_list
        if not added:
            return options, frozenset()
        return dataclasses.replace(options, read_later=options.read_later | added), added

    @contextlib.contextmanager
    def session(self, program):
        """Static mode; the marks of an earlier rewrite restored from its
        record (a program read from ``.json`` lost them) before, the record
        written where Paddle's ``.json`` keeps it after (not if the body raised)."""
        with pir_inplace.static_mode():
            pir_rewrite.restore_marks(program)
            yield
            pir_rewrite.write_record(program)

    def read(self, program, fetch_names=()) -> Graph:
        return pir.convert(program, sorted(fetch_names)).graph


PIR = PirIR()


#: What :func:`ir_of` gives for anything that is not a Paddle static program.
UNKNOWN = IR()


def ir_of(program) -> IR:
    """The IR ``program`` is in (legacy first, then PIR), or :data:`UNKNOWN`."""
    for ir in (LEGACY, PIR):
        if ir.owns(program):
            return ir
    return UNKNOWN
