"""A digest of every plan memory_optimize and release_memory make, to show a
refactoring changed no plan.

One line per model x IR x level x GC mode x skip_grads::

    mlp legacy level=0 gc=off skip_grads=True  plan=3f2a... releases=... report=...  (groups 4, ...)

``plan`` hashes what the rewrite did to the program, read from the program
itself before and after the public ``memopt.memory_optimize`` (no internal
seam, so the script does not change when the planner moves):

- legacy: which original variables now share memory (per block, the sets of
  original names that end up under one name -- keyed by the members, so the
  name the shared memory lives under does not matter), which ops run in
  place (an op that reads and writes one name it did not before, by original
  op index), which input slots read a substitute (dims-only reads), and the
  new order of block 0's ops (as original op indices);
- PIR: which ops became their in-place variants (flat position and names).

``releases`` hashes what ``memopt.release_memory`` inserted into a fresh
program (after which original op, which variables; the mode's GC flag);
``report`` the Report's numbers (peaks, temporaries, reasons, merged count:
informative -- a change in the estimates shows there even when the plan is
the same).

    python scripts/plan_digest.py [--models mlp,cnn] [--irs legacy,pir] > digest.txt
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

RELEASED_VAR = "memopt@released"


def _hash(obj) -> str:
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- legacy programs ---------------------------------------------------------------

def _legacy_ops(program):
    """Per block: ``[(type, {slot: names} inputs, {slot: names} outputs, persistable names)]``."""
    out = []
    for block in program.blocks:
        ops = []
        for op in block.ops:
            ins = {s: list(op.input(s)) for s in op.input_names}
            outs = {s: list(op.output(s)) for s in op.output_names}
            persist = set()
            for names in (*ins.values(), *outs.values()):
                for n in names:
                    var = block._find_var_recursive(n)
                    if var is not None and var.persistable:
                        persist.add(n)
            ops.append((op.type, ins, outs, tuple(sorted(persist))))
        out.append(ops)
    return out


def _key(op):
    op_type, ins, outs, persist = op
    return (op_type, tuple(sorted((s, len(v)) for s, v in ins.items())),
            tuple(sorted((s, len(v)) for s, v in outs.items())), persist)


def _match(before, after):
    """Original op index of each op of ``after`` (a permutation of ``before``
    whose ops may have renamed non-persistable names): greedy in order among
    the ops of the same type, slots and persistable names."""
    used = [False] * len(before)
    keys = [_key(op) for op in before]
    out = []
    for op in after:
        k = _key(op)
        for i, key in enumerate(keys):
            if not used[i] and key == k:
                used[i] = True
                out.append(i)
                break
        else:
            raise SystemExit(f"cannot match rewritten op {op[0]} to an original op")
    return out


def _legacy_plan(before, after):
    """The naming-invariant plan of a legacy rewrite (see the module docstring)."""
    plan = {"blocks": [], "order": None}
    for b, (ops0, ops1) in enumerate(zip(before, after)):
        if len(ops0) != len(ops1):
            raise SystemExit(f"block {b}: {len(ops0)} ops before, {len(ops1)} after")
        index = _match(ops0, ops1) if b == 0 else list(range(len(ops0)))
        if b == 0 and index != list(range(len(ops0))):
            plan["order"] = index
        final = {}     # original name -> name it is written under
        reads = []     # (orig op, slot, j, original name, new name)
        inplace = []
        for new_pos, i in enumerate(index):
            _, ins0, outs0, _ = ops0[i]
            _, ins1, outs1, _ = ops1[new_pos]
            for slot, names in outs0.items():
                for j, n in enumerate(names):
                    final.setdefault(n, set()).add(outs1[slot][j])
            for slot, names in ins0.items():
                for j, n in enumerate(names):
                    reads.append((i, slot, j, n, ins1[slot][j]))
            r0 = {n for v in ins0.values() for n in v}
            w0 = {n for v in outs0.values() for n in v}
            r1 = {n for v in ins1.values() for n in v}
            w1 = {n for v in outs1.values() for n in v}
            if len(r1 & w1) > len(r0 & w0):
                inplace.append((i, ops0[i][0]))
        bad = {n: sorted(s) for n, s in final.items() if len(s) != 1}
        if bad:
            raise SystemExit(f"block {b}: a variable written under several names: {bad}")
        final = {n: next(iter(s)) for n, s in final.items()}
        classes = {}
        for n, new in final.items():
            classes.setdefault(new, []).append(n)
        shared = sorted(sorted(c) for c in classes.values() if len(c) > 1)
        # a substitute read: the slot reads another variable's memory now
        # (named by the original members living under that name)
        members = {new: sorted(c) for new, c in classes.items()}
        substituted = sorted((i, slot, j, n, members.get(new, [new]))
                             for i, slot, j, n, new in reads if new != final.get(n, n))
        plan["blocks"].append({"shared": shared, "inplace": inplace,
                               "substituted": substituted})
    return plan


def _counts(plan) -> str:
    groups = sum(len(b["shared"]) for b in plan["blocks"])
    merged = sum(len(c) - 1 for b in plan["blocks"] for c in b["shared"])
    inplace = sum(len(b["inplace"]) for b in plan["blocks"])
    subs = sum(len(b["substituted"]) for b in plan["blocks"])
    moved = 0 if plan["order"] is None else sum(
        1 for k, i in enumerate(plan["order"]) if i != k)
    return f"groups {groups}, merged {merged}, in place {inplace}, substituted {subs}, " \
           f"reordered {moved}"


def _legacy_releases(before, after, record=None):
    """``[(original op index the release follows, released names)]``; a
    released name that now lives under a fresh ``memopt@buf_<k>`` is keyed by
    its original name (``record``: ``{original: fresh}``)."""
    original = {fresh: name for name, fresh in (record or {}).items()}
    out = []
    last = -1
    for op in after[0]:
        op_type, ins, outs, _ = op
        if op_type == "share_buffer" and ins.get("X") == [RELEASED_VAR]:
            out.append((last, [original.get(n, n) for n in outs.get("Out")]))
        else:
            last += 1
    return out


# -- PIR programs ------------------------------------------------------------------

def _pir_ops(program):
    out = []

    def walk(block):
        for op in block.ops:
            out.append(op.name())
            for sub in op.blocks():
                walk(sub)

    walk(program.global_block())
    return out


def _pir_plan(before, after):
    if len(before) != len(after):  # ops added or removed: the whole new op list
        return {"inplace": [], "ops": after}
    return {"inplace": [(k, a, b) for k, (a, b) in enumerate(zip(before, after)) if a != b]}


# -- the runs ----------------------------------------------------------------------

def _report_digest(report) -> str:
    d = report.to_dict()
    keep = {k: d[k] for k in ("merged_count", "temporaries_before", "temporaries_after",
                              "persistable_bytes", "peak_before", "peak_after",
                              "not_merged", "released")}
    keep["reuses"] = sorted((r["var"], r["takes"], r["how"]) for r in d["reuses"])
    return _hash(keep)


def run(models, irs, levels, out) -> None:
    import paddle

    import memopt
    from memopt.testing.models import build, flags

    paddle.enable_static()
    for name in models:
        for ir in irs:
            releases = {}
            for gc in (True, False):
                with flags(eager_delete_tensor_gb=0.0 if gc else -1.0):
                    model = build(name, ir)
                    if ir == "legacy":
                        ops0 = _legacy_ops(model.main)
                        with model.guard():  # the legacy executor it runs under
                            report = memopt.release_memory(model.main)
                        from memopt.paddle.legacy.program import merged_record

                        rel = _legacy_releases(ops0, _legacy_ops(model.main),
                                               merged_record(model.main))
                    else:
                        report = memopt.release_memory(model.main)
                        rel = []
                    releases[gc] = _hash([rel, report.released])
            for level in levels:
                for gc in (True, False):
                    for skip_grads in (True, False):
                        with flags(eager_delete_tensor_gb=0.0 if gc else -1.0):
                            model = build(name, ir)
                            if ir == "legacy":
                                ops0 = _legacy_ops(model.main)
                                with model.guard():
                                    report = memopt.memory_optimize(
                                        model.main, skip_grads=skip_grads, level=level)
                                plan = _legacy_plan(ops0, _legacy_ops(model.main))
                                counts = _counts(plan)
                            else:
                                ops0 = _pir_ops(model.main)
                                report = memopt.memory_optimize(
                                    model.main, skip_grads=skip_grads, level=level)
                                plan = _pir_plan(ops0, _pir_ops(model.main))
                                counts = f"in place {len(plan['inplace'])}"
                        print(f"{name} {ir} level={level} gc={'on' if gc else 'off'} "
                              f"skip_grads={skip_grads}  plan={_hash(plan)} "
                              f"releases={releases[gc]} report={_report_digest(report)}  "
                              f"({counts})", file=out, flush=True)


def main(argv=None) -> int:
    from memopt.testing.models import IRS, MODEL_NAMES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODEL_NAMES))
    ap.add_argument("--irs", default=",".join(IRS))
    ap.add_argument("--levels", default="0,1")
    args = ap.parse_args(argv)
    run(args.models.split(","), args.irs.split(","),
        [int(x) for x in args.levels.split(",")], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
