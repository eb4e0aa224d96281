"""Exception classes of memopt.

Every error memopt raises on bad input is one of these (or a plain
``TypeError``/``ValueError`` for a wrong argument at the call site), and its
message names the variable, op, file or argument at fault and what to do.
"""


class MemoptError(Exception):
    """Base class of memopt's own errors."""


class GraphError(MemoptError, ValueError):
    """A program model that is malformed: undeclared names, bad sub-blocks."""


class UnsupportedProgramError(MemoptError, TypeError):
    """A program object memopt does not know how to read."""


class PlanError(MemoptError):
    """A memory plan that breaks a rule: two live buffers share memory."""


class ProblemFormatError(MemoptError, ValueError):
    """An interval problem (CSV) that is malformed."""


class ModelFileError(MemoptError, ValueError):
    """A saved model file that is missing, truncated or of the wrong format."""


class MergedVariableError(MemoptError, KeyError):
    """A fetch of a variable whose memory memory_optimize gave to another."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class BudgetError(MemoptError, ValueError):
    """No plan fits the memory budget given to ``memory_optimize(budget=...)``.

    Both figures are checked by planning, as ``memory_optimize`` plans
    (same program, flags and ``fetch_list``):

    - ``smallest_budget``: the least budget (bytes) at which
      ``memory_optimize(budget=..., batch_size=batch_size)`` returns a plan
      (its grid of plans at that batch: every budget from it up plans, any
      lower one is refused);
    - ``largest_batch``: a batch below ``batch_size`` at which
      ``memory_optimize(budget=budget, batch_size=largest_batch)`` returns a
      plan, and the next batch up is refused (0: even batch 1 is refused).
      It is the largest such batch when a batch gets a plan whenever a
      larger one does (memory grows with the batch); memopt does not prove
      that, so strictly it is a checked lower bound of the largest.

    The program is left unchanged.
    """

    def __init__(self, message: str, budget: int = 0, batch_size: int = 0,
                 smallest_budget: int = 0, largest_batch: int = 0) -> None:
        super().__init__(message)
        self.budget = budget
        self.batch_size = batch_size
        self.smallest_budget = smallest_budget
        self.largest_batch = largest_batch


class StepAlreadyRunError(MemoptError, RuntimeError):
    """``memory_optimize`` on a ``paddle.jit.to_static`` step that has
    already run (or whose training program Paddle has already built and
    run): Paddle caches the program it ran and ignores later edits, so memopt
    must be installed before the step's first call.  The step is left
    unchanged."""


class PaddleInternalsError(MemoptError, RuntimeError):
    """The installed Paddle's ``paddle.jit.to_static`` internals are not the
    ones memopt's to_static hook was written against (the message names the
    Paddle version and what differs).  Raised before anything is changed."""
