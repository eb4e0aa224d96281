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

    ``smallest_budget`` is the least total peak (bytes) memopt can reach at
    ``batch_size``; ``largest_batch`` the largest batch size whose plan fits
    ``budget`` (0: none).  The program is left unchanged.
    """

    def __init__(self, message: str, budget: int = 0, batch_size: int = 0,
                 smallest_budget: int = 0, largest_batch: int = 0) -> None:
        super().__init__(message)
        self.budget = budget
        self.batch_size = batch_size
        self.smallest_budget = smallest_budget
        self.largest_batch = largest_batch
