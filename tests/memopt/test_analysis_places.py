"""Analysis reports name ops by the program's own positions.

Paddle's executor runs ops in dataflow order, so an op's run position (the
plot's x) is not where ``print(program)`` shows it.  PIR values' labels give
the program position (``pd_op.conv2d at op 232 (%247)``); the report's
``made by ... at op N`` and its peak line used the run position (``at op
274``) for the same op: one op, two numbers.  A legacy program is analysed
as its translation to PIR, whose positions (``pd_op.matmul_grad at op 128``
in a 30-op program) and made-up values (``%107``) the user never sees: they
are named by the legacy op they come from (``op 23 (mul_grad)``).
"""
import re

from memopt import analyze
from memopt.testing import models


def _holder_lines(text):
    return [ln for ln in text.splitlines() if " made by " in ln]


def test_pir_report_uses_the_labels_numbering(paddle):
    model = models.build("mlp", "pir", 16)
    an = analyze(model.main, 16, fetch_list=model.fetch_list)
    assert an.order != sorted(an.order)           # the run order is not the program's
    text = an.report(top=8)
    checked = 0
    for line in _holder_lines(text):
        # a value is labelled by its producer and output slot:
        # "pd_op.matmul_grad(...).y_grad at op 44 ... (%49)"
        label = re.search(r"^\s+([^\s(]+)\(\.\.\.\)\.\S+ at (op \d+)\b.*\(%\d+\)", line)
        made = re.search(r"made by (\S+) at (op \d+)", line)
        if label and made:
            assert label.groups() == made.groups(), line
            checked += 1
    assert checked >= 2, text
    pos = an.peak_position()
    assert f"run position {pos} (the plot's x)" in text or an.order[pos] == pos
    # each op's place is where print(program) has it in the top-level block
    ops = list(model.main.global_block().ops)
    for k, place in enumerate(an.places):
        m = re.fullmatch(r"op (\d+)", place)
        if m:
            assert ops[int(m.group(1))].name() == an.op_types[k], (k, place)


def test_legacy_report_names_the_legacy_ops(paddle):
    """``static.nn.fc`` writes legacy ``mul`` ops, whose translation reshapes
    around a matmul: the reshaped gradients are values of no legacy name."""
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [None, 64], "float32")
            hidden = paddle.nn.functional.relu(paddle.static.nn.fc(x, 128))
            loss = paddle.static.nn.fc(hidden, 1).mean()
            paddle.optimizer.SGD(0.1).minimize(loss)
        an = analyze(main, 16, fetch_list=[loss])
        legacy_types = [op.type for op in main.global_block().ops]
    placed = [p for p in an.places if p]
    assert placed, an.places
    for place in placed:
        index, legacy_type = re.fullmatch(r"op (\d+) \((\w+)\)", place).groups()
        assert legacy_types[int(index)] == legacy_type
    # what the translation made up is labelled by its legacy op, not %N alone
    made_up = [h for h in an.holders if h.name.startswith("%") and h.category != "workspace"]
    assert any("(mul_grad) (%" in h.label for h in made_up), [h.label for h in made_up]
    assert all(re.search(r" at op \d+ \(\w+\) \(%\d+\)$", h.label) for h in made_up)
    text = an.report(top=10)
    peak_line = next(ln for ln in text.splitlines() if "live at the peak op" in ln)
    assert re.search(r" at op \d+ \(\w+; pd_op\.\w+\)", peak_line), peak_line
    positions = [int(n) for n in re.findall(r"made by \S+ at op (\d+)", text)]
    assert positions and max(positions) < len(legacy_types), text
