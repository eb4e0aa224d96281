"""Why memopt left a variable or an op alone: :class:`Refusal`.

A plan counts its refusals by reason (``Report.not_merged``: reason ->
number of variables or ops).  Each reason is a member of :class:`Refusal`
whose value is the message the report prints; a member is also that message
as a string (``Refusal.PERSISTABLE == "persistable"``), so a report's keys
print, sort and serialize as text while the code names reasons by member.
"""
from __future__ import annotations

import enum

__all__ = ["Refusal"]


class Refusal(str, enum.Enum):
    """A reason memopt did not share a variable's memory or did not turn an
    op into its in-place variant; ``.message`` is what the report says."""

    # a variable left out of sharing (memopt.candidates.classify)
    PERSISTABLE = "persistable"
    IO = "feed/fetch/data"
    SKIP = "skip_opt_set"
    GRAD = "gradient (skip_grads=True)"
    FETCHED = "likely fetched (loss, never read, or fetch op input)"
    SHARED = "shared with control flow or another block"
    KIND = "not a dense tensor"
    COMM = "communication buffer (in flight until the end of the step)"
    ENTRY = "live at entry (read before written: an input or a loop-carried value)"
    # an op left as it is rather than made its in-place variant
    # (memopt.candidates.variant_inplace; GRAD and COMM too)
    PROTECTED = "input or output protected (persistable, fed, fetched, skip_opt_set)"
    ALIVE = "input still used later"
    READ_LATER = ("input read by a backward part not yet appended (call memory_optimize "
                  "after minimize)")
    SHAPE = "input and output differ in shape or dtype"
    OUTSIDE = "input from outside the op's block, carried by a loop, or a view"
    KERNEL = "CPU kernel cannot run in place"
    ORDER = ("input read by another op too (level 2: only in-place variants no executor "
             "order can make worse)")
    # level 2 left every in-place variant out (memopt.pipeline.pir.variants_pay)
    NO_GAIN = ("level 2: the in-place variants together lower no predicted peak (level 2 "
               "changes the program only where the model predicts it lower)")

    @property
    def message(self) -> str:
        """What the report says for this reason."""
        return self.value

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
