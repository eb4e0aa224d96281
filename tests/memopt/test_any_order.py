"""With the garbage collector on, memopt applies only plans that hold in
every order Paddle's multi-thread executor may run the ops in
(memopt.any_order): no op moves, and an op runs in place only over an input
it alone reads."""
from memopt.any_order import single_reader_rule
from memopt.graph import Graph, Op, OpFacts, Var
from memopt.plan import Options
from memopt.planner import plan_memory
from memopt.verify import check_plan

ALL = Options(skip_grads=False, level=1)


def diamond():
    """x -> t0; t0 read by relu (in place, its last use in program order)
    and, before it, by an independent scale; both feed the loss.  In
    program order t0 dies at the relu, but the executor may run the scale
    after the relu: writing over t0 there would force an order."""
    g = Graph(fetch_names=())
    b = g.global_block
    for name in ("x", "t0", "u", "t1", "s", "loss"):
        b.add_var(Var(name, (-1, 8) if name != "loss" else (), is_data=name == "x"))
    b.add_op(Op("relu", ("x",), ("t0",)))
    b.add_op(Op("scale", ("t0",), ("u",)))
    b.add_op(Op("relu", ("t0",), ("t1",), facts=OpFacts(inplace=("t0", "t1"))))
    b.add_op(Op("elementwise_add", ("t1", "u"), ("s",)))
    b.add_op(Op("mean", ("s",), ("loss",), facts=OpFacts(loss=True)))
    return g


def test_shared_input_is_not_taken_over_with_gc_on():
    g = diamond()
    on = plan_memory(g, ALL, gc=True)
    check_plan(g, on)
    assert ("t0", "t1") not in {(s, d) for s, d, _ in on.inplace}
    off = plan_memory(diamond(), ALL, gc=False)
    assert ("t0", "t1") in {(s, d) for s, d, _ in off.inplace}


def test_sole_reader_runs_in_place_with_gc_on():
    g = diamond()
    b = g.global_block
    b.ops[1] = Op("scale", ("x",), ("u",))        # the scale reads x now
    plan = plan_memory(g, ALL, gc=True)
    check_plan(g, plan)
    assert [(s, d) for s, d, _ in plan.inplace] == [("t0", "t1")]
    assert plan.order is None


def test_rule_counts_every_reader_and_writer():
    g = diamond()
    allowed = single_reader_rule(g)
    ops = g.global_block.ops
    assert not allowed("t0", "t1", ops[2])          # scale reads t0 too
    assert allowed("t1", "s", ops[3])               # only the add reads t1
    assert not allowed("t1", "s", ops[4])           # not by this op
    g.global_block.add_op(Op("scale", ("x",), ("t1",)))   # t1 written twice
    assert not single_reader_rule(g)("t1", "s", ops[3])


import pytest  # noqa: E402


@pytest.mark.parametrize("name, level", [("vgg", 0), ("gpt_einsum", 0), ("amp_bf16", 1)])
def test_real_programs_gc_on(paddle, name, level):
    """On real legacy training programs with GC on: no op moves, every
    in-place reuse takes over an input that only its op reads (a grad op's
    dims-only read now reads its own Out@GRAD), and training stays
    bit-identical."""
    import numpy as np

    import memopt
    from memopt.testing import models

    model = models.build(name, "legacy")
    before = [(op.type, {s: list(op.input(s)) for s in op.input_names},
               {n for s in op.output_names for n in op.output(s)})
              for op in model.main.global_block().ops]
    expected = models.run_steps(models.build(name, "legacy"), 2)
    with models.flags(eager_delete_tensor_gb=0.0), model.guard():
        report = memopt.memory_optimize(model.main, level=level, skip_grads=False,
                                        skip_opt_set=[model.fetch_list[1]])
    assert [op.type for op in model.main.global_block().ops] == [t for t, _, _ in before]
    assert not any("moved" in note for note in report.notes)
    assert report.reuses and all(r.how == "in-place" for r in report.reuses)
    after = model.main.global_block().ops

    def reads(k, name):
        """Op k reads ``name`` for its data, or its dims without a substitute."""
        for slot, names in before[k][1].items():
            substituted = (slot != "Out@GRAD" and "Out@GRAD" in before[k][1]
                           and after[k].input(slot) == after[k].input("Out@GRAD"))
            if name in names and not substituted:
                return True
        return False

    for r in report.reuses:
        readers = [k for k in range(len(before)) if reads(k, r.takes)]
        writers = [k for k, (_, _, outs) in enumerate(before) if r.takes in outs]
        assert len(readers) == 1 and len(writers) == 1, (r.takes, readers, writers)
        assert r.var in before[readers[0]][2]
    actual = models.run_steps(model, 2)
    for a, b in zip(expected.fetches, actual.fetches, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(expected.params, actual.params, strict=True))
