"""TFP-style user code for the parity checks of ``test_tfp_parity.py``,
written once against a package ``ab`` that is either autobatch or TFP 0.25's
``auto_batching`` (its modules: ``ab.instructions``, ``ab.liveness``,
``ab.type_inference``, ``ab.stackless``, ``ab.xla``, ``ab.numpy_backend``).
Each check returns plain data (lists, ints, strings, bools), so that the two
runs can be compared for equality: :data:`CHECKS` names them."""
import re

import numpy as np


def _if_graph(inst):
    """TFP's single-if graph with named blocks: 2 where input > 1, else 0."""
    entry, yes, no = inst.Block(name="entry"), inst.Block(name="yes"), inst.Block(name="no")
    entry.assign_instructions([inst.prim_op(["input"], "cond", lambda n: n > 1),
                               inst.BranchOp(cond_var="cond", true_block=yes, false_block=no)])
    yes.assign_instructions([inst.prim_op(["input"], "answer", lambda n: n * 2),
                             inst.GotoOp(block=None)])
    no.assign_instructions([inst.prim_op([], "answer", lambda: 0), inst.halt_op()])
    return inst.ControlFlowGraph([entry, yes, no])


def liveness_of_if(ab):
    """``liveness.liveness_analysis`` of the if graph: per block, the live
    sets in, after each instruction, and out."""
    graph = _if_graph(ab.instructions)
    info = ab.liveness.liveness_analysis(graph, ["answer"])
    out = {}
    for block in graph.blocks:
        live = info[block]
        out[block.label_str] = [sorted(live.live_into_block),
                                [sorted(s) for s in live.live_out_instructions],
                                sorted(live.live_out_of_block)]
    out["exit"] = sorted(info[None].live_into_block)
    return out


def ir_field_names(ab):
    """TFP's field names of terminators and primops, and a Program's views."""
    inst = ab.instructions
    graph = _if_graph(inst)
    entry, yes, _ = graph.blocks
    branch = entry.terminator
    fields = [branch.cond_var, branch.true_block.label_str, branch.false_block.label_str,
              yes.terminator.block is None]
    push = inst.PushGotoOp(push_block=yes, goto_block=entry)
    prim = inst.PrimOp(["a"], "b", lambda a: a, {"b"})
    program = inst.Program(graph, [], {"input": inst.single_type(np.int64, ()),
                                       "cond": inst.single_type(np.bool_, ()),
                                       "answer": inst.single_type(np.int64, ())},
                           ["input"], "answer")
    after = entry.terminator                                 # read after Program holds it
    return fields + [push.push_block.name, push.goto_block.name, sorted(prim.skip_push_mask),
                     list(program.vars_in), program.vars_out,
                     [b.label_str for b in program.graph.blocks],
                     after.true_block is yes, after.false_block.label_str]


def patterns(ab):
    """TFP's pattern functions with ``leaf_type``."""
    inst = ab.instructions
    leaf = inst.TensorType(np.int32, ())
    typed = [inst.Type(leaf), (inst.Type(leaf), inst.Type(leaf))]
    flat = inst.pattern_flatten(typed, leaf_type=inst.Type)
    pairs = list(inst.pattern_zip(["a", ("b", "c")], [1, [2, (3, 4)]]))
    summed = inst.pattern_map2(lambda x, y: x + y, [1, (2, 3)], [10, [20, 30]])
    mapped = inst.pattern_map(lambda t: isinstance(t, inst.Type), typed,
                              leaf_type=inst.Type)
    return [len(flat), [[a, list(b) if isinstance(b, (list, tuple)) else b] for a, b in pairs],
            [summed[0], list(summed[1])], [mapped[0], list(mapped[1])],
            isinstance(summed[1], tuple)]


def batch_sizes(ab):
    """``instructions.detect_batch_size``: sizes of 1 broadcast; two other
    sizes are an error."""
    inst = ab.instructions
    backend = ab.numpy_backend.NumpyBackend()
    var_defs = {"a": inst.single_type(np.int64, ()),
                "b": inst.Type((inst.TensorType(np.int64, ()), inst.TensorType(np.float64, (2,))))}
    found = inst.detect_batch_size(var_defs, {"a": np.zeros(4), "b": (np.zeros(1),
                                                                       np.zeros((4, 2)))},
                                   backend)
    try:
        inst.detect_batch_size(var_defs, {"a": np.zeros(4), "b": (np.zeros(3), np.zeros((3, 2)))},
                               backend)
        error = "none"
    except ValueError as exc:
        error = "ValueError" if "Inconsistent batch sizes" in str(exc) else str(exc)
    return [found, error]


def _call_program(inst, record):
    """main(n) = twice(n), twice(x) = x + x; the primop calls ``record()``
    (to see which machinery is running it)."""
    def double(x):
        record()
        return x + x
    body = inst.Block(name="twice_body")
    twice = inst.Function(None, ["x"], "y", lambda types: types[0], name="twice")
    body.assign_instructions([inst.prim_op(["x"], "y", double), inst.halt_op()])
    twice.graph = inst.ControlFlowGraph([body])
    main = inst.ControlFlowGraph([inst.Block([inst.FunctionCallOp(twice, ["n"], "out")],
                                             inst.halt_op(), name="main_entry")])
    typ = inst.single_type(np.int64, ())
    return inst.Program(main, [twice], {"n": typ, "x": typ, "y": typ, "out": typ},
                        ["n"], "out")


def machinery_flags(ab):
    """What ``type_inference.is_inferring`` and ``stackless.is_running`` say
    inside a primitive: during ``infer_types_from_signature``, during
    ``stackless.execute(program, backend, block_code_cache, *inputs)``, and
    outside both; ``type_inference.signature`` of the input; the result."""
    def flags():
        return [ab.type_inference.is_inferring(), ab.stackless.is_running()]
    seen = set()
    program = _call_program(ab.instructions, lambda: seen.add(tuple(flags())))
    backend = ab.numpy_backend.NumpyBackend()
    n = np.array([1, 2, 3], dtype=np.int64)
    sig = ab.type_inference.signature(program, [n], backend)
    typed = ab.type_inference.infer_types_from_signature(program, sig, backend)
    during_inference = sorted(seen)
    seen.clear()
    out = ab.stackless.execute(typed, backend, None, n)
    return {"signature": [[np.dtype(t.dtype).name, list(t.shape)] for t in sig],
            "inference": [list(s) for s in during_inference],
            "stackless": [list(s) for s in sorted(seen)],
            "result": np.asarray(out).tolist(), "outside": flags()}


def xla_nested(ab):
    """``xla.compile_nested_output`` with a ``jit_compile`` compile_fn: a
    nested result comes back nested."""
    import tensorflow as tf

    def compile_fn(fn, inputs):
        return tf.function(fn, jit_compile=True)(*inputs)

    def f(x, pair):
        return {"sum": x + pair[0], "both": (x * 2, [pair[1] - x])}
    g = ab.xla.compile_nested_output(f, compile_fn)
    out = g(tf.constant([1.0, 2.0]), (tf.constant([10.0, 20.0]), tf.constant(5.0)))
    return [sorted(out), out["sum"].numpy().tolist(), type(out["both"]).__name__,
            out["both"][0].numpy().tolist(), type(out["both"][1]).__name__,
            out["both"][1][0].numpy().tolist()]


def _unnamed_labels(text):
    """``text`` with unnamed blocks' labels (TFP's ``block-<hash>``,
    autobatch's ``block_<k>``) replaced by ``B0``, ``B1``... in order of
    first appearance (TFP's hashes differ from run to run)."""
    seen = {}
    return re.sub(r"block[-_]\d+", lambda m: seen.setdefault(m.group(0), f"B{len(seen)}"), text)


def printed_programs(ab):
    """``str(program)`` of programs built TFP's way: the if graph (named
    blocks), a call program, a tuple-typed variable with an unnamed block,
    and the call program at ``indent=2, width=20`` (lines broken after the paren)."""
    inst = ab.instructions
    i64, boolean = inst.single_type(np.int64, ()), inst.single_type(np.bool_, ())
    if_program = inst.Program(_if_graph(inst), [],
                              {"input": i64, "cond": boolean, "answer": i64},
                              ["input"], "answer")
    call_program = _call_program(inst, lambda: None)
    leaf = inst.TensorType(np.float32, (3,))
    block = inst.Block()
    block.assign_instructions([
        inst.prim_op(["inp"], ("pair", "other_name"), lambda x: ((x, x), x)),
        inst.halt_op()])
    tuple_program = inst.Program(inst.ControlFlowGraph([block]), [],
                                 {"inp": inst.Type(leaf), "pair": inst.Type((leaf, leaf)),
                                  "other_name": inst.Type(leaf)},
                                 ["inp"], ("pair", "other_name"))
    return [_unnamed_labels(str(p)) for p in (if_program, call_program, tuple_program)] + [
        _unnamed_labels(call_program.__str__(indent=2, width=20))]


CHECKS = {f.__name__: f for f in (liveness_of_if, ir_field_names, patterns, batch_sizes,
                                  machinery_flags, xla_nested, printed_programs)}
