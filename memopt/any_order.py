"""Which memory plans hold under every order the executor may run ops in.

Paddle's default executor (GC on, several threads) runs an op as soon as
its inputs are ready and frees a variable when the last op using it has run
(reference counts).  Which of the many orders allowed by the program's
dependencies it picks depends on timing and on program order as a
tie-break, so a plan judged in program order only can raise the peak in the
order the executor really takes.  Measured on Paddle 3.3.1 (legacy
programs, GC on, ``benchmarks/bench_memopt.py``): moving optimizer ops up to
their gradients (which program order favours, the executor does not have
to) raised it by up to 28%.

The rule memopt applies with the garbage collector on: an op ``P`` may run
in place -- write its output ``dst`` over its input ``src`` -- only if

- ``P`` is the one op that reads ``src`` (dims-only reads included) and one
  op writes ``src``;

and nothing else changes but dims-only substitutions (no op moves).  A
dims-only substitution makes a grad op read the dims of its own
``Out@GRAD``, which it reads for its data anyway, instead of those of its
forward input: a read goes and none comes, and the ordering edge that goes
is implied by the one that stays (``Out@GRAD`` is computed after the
forward op that read the input).  Then, in every order the dependencies
allow:

- ``src`` dies at ``P`` in the original program whatever the order (no other
  reader can run later), so the merged buffer lives exactly while ``src``
  and then ``dst`` did, and at each moment of the run the memory held is at
  most what the original holds (one buffer instead of two at ``P``);
- the dependencies are the ones the program had: no reader of ``src``
  has to wait for ``P`` and no op that reads ``dst`` gains a predecessor,
  so the executor chooses among exactly the orders it chose among before.

Hence the peak cannot rise, whichever order the executor takes.  (With the
GC off nothing is freed during a run and the order does not change what is
held: the rule is not needed there.)
"""
from __future__ import annotations

from typing import Callable, Dict

from .graph import Graph


def single_reader_rule(graph: Graph) -> Callable[[str, str, object], bool]:
    """``allowed(src, dst, op)``: whether ``op`` may write ``dst`` over
    ``src`` under the rule above (``op`` is the graph's Op object)."""
    readers: Dict[str, set] = {}
    writers: Dict[str, int] = {}
    for _, op in graph.walk_ops():
        for name in set(op.reads):
            readers.setdefault(name, set()).add(id(op))
        for name in set(op.writes):
            writers[name] = writers.get(name, 0) + 1

    def allowed(src: str, dst: str, op: object) -> bool:
        return readers.get(src) == {id(op)} and writers.get(src, 0) == 1

    return allowed
