"""Sweep the ``memopt`` command as a new user meets it, on saved models of
every kind, both IRs: model x subcommand.

Models (saved the ways users save them, into a scratch directory):
``paddle.static.save_inference_model`` of one input, of several (int64 ids
with a dynamic sequence dim + float features, three outputs), of a
``while_loop`` + ``cond`` program and (legacy) of a LoD ``sequence_pool``
model; ``paddle.jit.save`` of ResNet-18 / MobileNetV3-small (``[None, ...]``
and fixed input specs), a TransformerEncoder and an LSTM classifier (PIR:
Paddle 3.3.1 cannot ``jit.save`` those two with ``FLAGS_enable_pir_api=0``);
a training program saved with ``paddle.static.save``; (legacy) a
``save_vars`` directory with ``__model__`` and one file per parameter or one
combined file.

Columns: ``analyze`` (text), ``--json`` (the documented keys, peak = max of
the timeline), ``--budget`` (a largest batch), ``plot`` PNG and SVG (the file
is an image with the before/after legend), ``optimize`` at levels 0/1/2
(then, in a new process, ``load_inference_model`` + Executor and
``paddle.inference``'s predictor on the written model: outputs
``np.array_equal`` to the original model's under the same runner; a
training program: ``paddle.static.load`` of the written files and one step,
parameters equal; legacy only: a PIR program read back from its ``.json``
has no scope variables for ``paddle.static.load`` to fill), ``estimate
--dp 2 --sharding-stage 1 --json``.  Then bad input: each must exit 1 or 2
with one ``memopt: error:`` / ``usage:`` line, no traceback, and leave the
input model as it was.

Cells: ``ok`` / ``refused: <line>`` (a clean refusal) / ``BUG: <what>``;
they are the tests of ``test_sweep_cli.py`` (this module builds the models,
``--build IR DIR``, and runs a written one, ``--run``, in worker processes).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: keys ``memopt analyze --json`` documents (README, "The memopt command")
ANALYZE_KEYS = ("model", "ir", "batch_size", "peak_bytes", "peak_op", "persistable_bytes",
                "total_peak_bytes", "timeline", "held_at_peak")
VISION = ("jit_resnet18_dyn", "jit_resnet18_fixed", "jit_mbv3s_dyn")


def _env(ir, **extra):
    env = dict(os.environ, GLOG_minloglevel="2", PYTHONWARNINGS="ignore",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    if ir == "legacy":
        env["FLAGS_enable_pir_api"] = "0"
    return env


def cli(*args, ir="pir", timeout=600):
    return subprocess.run([sys.executable, "-m", "memopt.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=_env(ir))


def worker(*args, ir):
    return subprocess.run([sys.executable, os.path.abspath(__file__), *map(str, args)],
                          capture_output=True, text=True, timeout=900, env=_env(ir))


# -- building the models (a worker process per IR) ---------------------------------

def build_models(ir, root, quick):
    """Save every model of ``ir`` under ``root``; feeds go to ``root/feeds.npz``."""
    import numpy as np
    import paddle

    rng = np.random.default_rng(0)
    feeds = {}

    def inference_model(name, build, feed):
        paddle.enable_static()
        main, start = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, start):
            ins, outs = build()
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()):
            exe.run(start)
            paddle.static.save_inference_model(f"{root}/{name}", ins, outs, exe, program=main)
        feeds[name] = feed

    def one_input():
        x = paddle.static.data("x", [None, 16], "float32")
        h = paddle.nn.functional.relu(paddle.static.nn.fc(x, 32))
        h = paddle.nn.functional.relu(paddle.static.nn.fc(h, 32))
        return [x], [paddle.nn.functional.softmax(paddle.static.nn.fc(h, 4))]

    def several_inputs():
        ids = paddle.static.data("ids", [None, None], "int64")  # batch x sequence
        feat = paddle.static.data("feat", [None, 8], "float32")
        table = paddle.static.create_parameter([100, 16], "float32", name="emb_w")
        pooled = paddle.mean(paddle.nn.functional.embedding(ids, table), axis=1)
        h = paddle.concat([pooled, paddle.static.nn.fc(feat, 16)], axis=1)
        h = paddle.nn.functional.relu(paddle.static.nn.fc(h, 32))
        logits = paddle.static.nn.fc(h, 3)
        # paddle.argmax is broken in 3.3.1's legacy static mode: topk's indices
        return [ids, feat], [paddle.nn.functional.softmax(logits), paddle.topk(logits, k=1)[1], h]

    def while_cond():
        x = paddle.static.data("x", [None, 8], "float32")
        h = paddle.static.nn.fc(x, 8)
        n = paddle.full([1], 3, "int64")
        _, h = paddle.static.nn.while_loop(
            lambda i, h: i < n,
            lambda i, h: (i + 1, paddle.nn.functional.relu(h) * 0.9 + 0.1),
            [paddle.full([1], 0, "int64"), h])
        s = paddle.mean(h)
        if ir == "pir":
            out = paddle.static.nn.cond(s > 0, lambda: h * 2.0, lambda: h - 1.0)
        else:  # 3.3.1's legacy static.nn.cond calls a broken logical_not
            from memopt.testing.models import _legacy_cond
            out = _legacy_cond(s > 0, s <= 0, lambda: h * 2.0, lambda: h - 1.0)
        return [x], [out]

    def lod():
        words = paddle.static.data("words", [None, 1], "int64", lod_level=1)
        table = paddle.static.create_parameter([50, 8], "float32", name="lod_emb")
        emb = paddle.nn.functional.embedding(words, table)
        pooled = paddle.static.nn.sequence_lod.sequence_pool(paddle.squeeze(emb, [1]), "sum")
        return [words], [paddle.static.nn.fc(pooled, 2)]

    inference_model("static_one", one_input,
                    {"x": rng.standard_normal((4, 16)).astype("float32")})
    inference_model("static_multi", several_inputs,
                    {"ids": rng.integers(0, 100, (4, 7)).astype("int64"),
                     "feat": rng.standard_normal((4, 8)).astype("float32")})
    inference_model("static_while_cond", while_cond,
                    {"x": rng.standard_normal((4, 8)).astype("float32")})
    if ir == "legacy":
        inference_model("static_lod", lod, {"words": rng.integers(0, 50, (5, 1)).astype("int64")})

    paddle.enable_static()
    main, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, start):
        x = paddle.static.data("x", [None, 16], "float32")
        y = paddle.static.data("y", [None, 1], "int64")
        logits = paddle.static.nn.fc(paddle.nn.functional.relu(paddle.static.nn.fc(x, 64)), 4)
        loss = paddle.nn.functional.cross_entropy(logits, y).mean()
        paddle.optimizer.Adam(1e-3).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe.run(start)
        paddle.static.save(main, f"{root}/train")
        if ir == "legacy":  # fluid-style directories: __model__ + separate / combined params
            for d, filename in (("vars_separate", None), ("vars_combined", "params")):
                paddle.static.save_vars(exe, f"{root}/{d}", main,
                                        predicate=lambda v: v.persistable, filename=filename)
                with open(f"{root}/{d}/__model__", "wb") as f:
                    f.write(main.desc.serialize_to_string())
    feeds["train"] = {"x": rng.standard_normal((4, 16)).astype("float32"),
                      "y": rng.integers(0, 4, (4, 1)).astype("int64")}

    paddle.disable_static()
    paddle.seed(0)
    from paddle.static import InputSpec

    from memopt.testing.encoders import encoder_layer

    def Encoder():
        return encoder_layer(d_model=32, vocab=100, d_ff=64, classes=5, dropout=0.0)

    class LSTMClassifier(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = paddle.nn.Embedding(100, 16)
            self.lstm = paddle.nn.LSTM(16, 32)
            self.out = paddle.nn.Linear(32, 2)

        def forward(self, ids):
            _, (h, _) = self.lstm(self.emb(ids))
            return self.out(h[-1])

    from paddle.vision.models import mobilenet_v3_small, resnet18

    image = {"image": rng.standard_normal((2, 3, 64, 64)).astype("float32")}
    ids = {"ids": rng.integers(0, 100, (2, 9)).astype("int64")}
    dyn_image = [InputSpec([None, 3, 64, 64], "float32", "image")]
    layers = [
        ("jit_transformer_dyn", Encoder, [InputSpec([None, None], "int64", "ids")], ids),
        ("jit_transformer_fixed", Encoder, [InputSpec([2, 9], "int64", "ids")], ids),
        ("jit_lstm_dyn", LSTMClassifier, [InputSpec([None, None], "int64", "ids")], ids),
    ]
    if not quick:
        layers += [
            ("jit_resnet18_dyn", lambda: resnet18(num_classes=10), dyn_image, image),
            ("jit_resnet18_fixed", lambda: resnet18(num_classes=10),
             [InputSpec([2, 3, 64, 64], "float32", "image")], image),
            ("jit_mbv3s_dyn", lambda: mobilenet_v3_small(num_classes=10), dyn_image, image),
        ]
    for name, make, spec, feed in layers:
        layer = make()
        layer.eval()
        try:
            paddle.jit.save(layer, f"{root}/{name}", input_spec=spec)
        except Exception as exc:  # noqa: BLE001 - Paddle's own limit, reported in the table
            with open(f"{root}/{name}.unsaved", "w") as f:
                f.write(str(exc).strip().splitlines()[0][:120])
            continue
        feeds[name] = feed
    np.savez(f"{root}/feeds.npz",
             **{f"{m}::{k}": v for m, feed in feeds.items() for k, v in feed.items()})


# -- running a written model (a worker process) --------------------------------------

def _feed(root, name):
    import numpy as np

    data = np.load(os.path.join(root, "feeds.npz"))
    return {k.split("::", 1)[1]: data[k] for k in data.files if k.startswith(name + "::")}


def run_model(ir, root, name, prefix, how, out):
    """Run the model saved at ``prefix`` on ``name``'s feed; save its outputs
    (inference models) or its parameters after one step (``train``)."""
    import numpy as np
    import paddle

    if ir == "pir":
        import memopt  # noqa: F401  (the fetch guard reads memopt's record)
    feed = _feed(root, name)
    paddle.enable_static()
    exe = paddle.static.Executor(paddle.CPUPlace())
    if name == "static_lod":
        tensor = paddle.base.core.LoDTensor()
        tensor.set(feed["words"], paddle.CPUPlace())
        tensor.set_recursive_sequence_lengths([[2, 3]])
        feed = {"words": tensor}
    if name == "train":
        from memopt.paddle.modelio import load_model

        program = load_model(prefix + (".json" if ir == "pir" else ".pdmodel")).program
        paddle.static.load(program, prefix, exe)
        exe.run(program, feed=feed)
        scope = paddle.static.global_scope()
        names = sorted(p.name for p in program.all_parameters())
        result = [np.array(scope.find_var(n).get_tensor()) for n in names]
    elif how == "exe":
        program, feed_names, fetches = paddle.static.load_inference_model(prefix, exe)
        result = exe.run(program, feed={n: feed[n] for n in feed_names}, fetch_list=fetches)
    else:
        from paddle import inference

        config = inference.Config(prefix + (".json" if ir == "pir" else ".pdmodel"),
                                  prefix + ".pdiparams")
        config.disable_gpu()
        predictor = inference.create_predictor(config)
        for n in predictor.get_input_names():
            handle = predictor.get_input_handle(n)
            if name == "static_lod":
                handle.copy_from_cpu(np.array(feed[n]))
                handle.set_lod([[0, 2, 5]])
            else:
                handle.copy_from_cpu(feed[n])
        predictor.run()
        result = [predictor.get_output_handle(n).copy_to_cpu()
                  for n in predictor.get_output_names()]
    np.savez(out, *[np.asarray(r) for r in result])


def same_outputs(ir, root, name, original, written, how, tmp):
    """None if the written model's outputs equal the original's, else why not."""
    import numpy as np

    outs = []
    for tag, prefix in (("a", original), ("b", written)):
        out = os.path.join(tmp, f"{name}_{how}_{tag}.npz")
        result = worker("--run", ir, root, name, prefix, how, out, ir=ir)
        if result.returncode:
            lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
            return f"{how} fails on the {'original' if tag == 'a' else 'written'} model: " \
                   + (lines[-1][:120] if lines else f"exit {result.returncode}")
        outs.append(np.load(out))
    a, b = outs
    if len(a.files) != len(b.files):
        return f"{how}: {len(a.files)} outputs vs {len(b.files)}"
    for k in a.files:
        if a[k].dtype != b[k].dtype or not np.array_equal(a[k], b[k]):
            return f"{how}: output {k} differs (max {np.abs(a[k] - b[k]).max():.3g})"
    return None


# -- the sweep ----------------------------------------------------------------------

def _first_error_line(result):
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    if "Traceback" in result.stderr:
        return None
    errors = [ln for ln in lines if ln.startswith("memopt: error:") or " error: " in ln]
    return errors[0] if result.returncode in (1, 2) and errors else None


def cell(result, check=None):
    """``ok``, ``refused: ...`` or ``BUG: ...`` for one CLI run."""
    if result.returncode == 0:
        problem = check(result) if check else None
        return "ok" if not problem else f"BUG: {problem}"
    line = _first_error_line(result)
    if line is not None and result.returncode == 1 and len(
            [ln for ln in result.stderr.splitlines() if ln.startswith("memopt: error")]) == 1:
        return "refused: " + line[len("memopt: error: "):][:90]
    tail = [ln for ln in result.stderr.splitlines() if ln.strip()][-1:] or ["(no stderr)"]
    return f"BUG: exit {result.returncode}: {tail[0][:110]}"


def check_json_keys(result):
    try:
        doc = json.loads(result.stdout)
    except ValueError as exc:
        return f"--json output is not JSON ({exc})"
    missing = [k for k in ANALYZE_KEYS if k not in doc]
    if missing:
        return f"--json lacks {missing}"
    if doc["peak_bytes"] != max(doc["timeline"]):
        return f"peak_bytes {doc['peak_bytes']} != max(timeline) {max(doc['timeline'])}"
    return None


def check_image(path, kind):
    def check(result):
        if not os.path.isfile(path):
            return f"{path} not written"
        data = open(path, "rb").read()
        if kind == "png" and not (data.startswith(PNG_MAGIC) and len(data) > 10_000):
            return f"{path}: not a PNG with content ({len(data)} bytes)"
        if kind == "svg" and not (b"<svg" in data[:2000] and b"before" in data
                                  and b"after" in data):
            return f"{path}: not an SVG with the before/after legend"
        return None
    return check


def sweep_model(ir, root, name, tmp):
    """The row of one model: {column: cell}."""
    ext = ".json" if ir == "pir" else ".pdmodel"
    model = os.path.join(root, name) if name.startswith("vars_") else os.path.join(root,
                                                                                   name + ext)
    digest = _digest(root)
    row = {}
    row["analyze"] = cell(cli("analyze", model, "-b", 4, "-q", ir=ir),
                          lambda r: None if "peak of the step" in r.stdout else "no peak line")
    row["--json"] = cell(cli("analyze", model, "-b", 4, "--json", "-q", ir=ir), check_json_keys)
    row["--budget"] = cell(cli("analyze", model, "--budget", "64MiB", "--json", "-q", ir=ir),
                           lambda r: None if "max_batch_size" in json.loads(r.stdout)
                           else "no max_batch_size")
    for kind in ("png", "svg"):
        out = os.path.join(tmp, f"{ir}_{name}.{kind}")
        row[f"plot {kind}"] = cell(cli("plot", model, "-o", out, "-b", 4, "-q", ir=ir),
                                   check_image(out, kind))
    for level in (0, 1, 2):
        if level == 2 and ir == "legacy":
            continue
        out = os.path.join(tmp, f"{ir}_{name}_L{level}")
        result = cli("optimize", model, "--level", level, "-o", out + ext, "--json", "-q", ir=ir)
        col = f"optimize L{level}"
        row[col] = cell(result)
        if row[col] != "ok" or name.startswith("vars_"):
            continue
        if name == "train" and ir == "pir":
            continue  # paddle.static.load needs the program built in Python, not read back
        runners = ("exe",) if name == "train" else ("exe", "predictor")
        problems = [p for p in (same_outputs(ir, root, name, os.path.join(root, name), out,
                                             how, tmp) for how in runners) if p]
        warned = "warning" in json.loads(result.stdout)
        # the predictor's differing last bits are what the CLI's warning says
        # ... and a predictor that cannot load a legacy level-1 model (warned too)
        differs = [p for p in problems if p.startswith(("predictor: output",
                                                         "predictor fails on the written"))]
        problems = [p for p in problems if not (warned and p in differs)]
        if problems:
            row[col] = "BUG: " + "; ".join(problems)
        elif warned:
            state = "same" if not differs else "fails" if "fails" in differs[0] else "differs"
            row[col] = f"ok (warned; predictor {state})"
    row["estimate"] = cell(cli("estimate", model, "-b", 8, "--dp", 2, "--sharding-stage", 1,
                               "--json", "-q", ir=ir),
                           lambda r: None if "peak_per_rank" in json.loads(r.stdout)
                           else "no peak_per_rank")
    if _digest(root) != digest:
        row["input kept"] = "BUG: a model file under the input directory changed"
    return row


def _digest(root):
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            with open(os.path.join(dirpath, f), "rb") as fh:
                h.update(f.encode() + fh.read())
    return h.hexdigest()


def bad_inputs(root, tmp):
    """(case, args, ir) of input a user gets wrong."""
    pir, legacy = os.path.join(root, "pir"), os.path.join(root, "legacy")
    one = os.path.join(pir, "static_one.json")
    data = open(one, "rb").read()
    files = {
        "truncated .json": ("cut.json", data[: len(data) // 2]),
        "truncated .pdmodel": ("cut.pdmodel",
                               open(os.path.join(legacy, "static_one.pdmodel"), "rb").read()[:300]),
        "text as .pdmodel": ("text.pdmodel", b"hello\n"),
        "binary as .json": ("bin.json", bytes(range(256)) * 4),
        "empty .json": ("empty.json", b""),
        "other JSON": ("other.json", b'{"a": 1}'),
        "a .txt file": ("notes.txt", b"x"),
        "a .pdiparams.info": ("m.pdiparams.info", b"\x00" * 8),
    }
    cases = []
    for case, (fname, content) in files.items():
        path = os.path.join(tmp, fname)
        with open(path, "wb") as f:
            f.write(content)
        cases.append((case, ["analyze", path], "pir"))
    blocker = os.path.join(tmp, "a_file")
    open(blocker, "w").close()
    cases += [
        ("missing path", ["analyze", os.path.join(tmp, "nothere")], "pir"),
        ("a directory", ["analyze", pir], "pir"),
        ("a .pdiparams", ["analyze", os.path.join(pir, "static_one.pdiparams")], "pir"),
        ("--batch 0", ["analyze", one, "-b", "0"], "pir"),
        ("--batch -1", ["analyze", one, "-b", "-1"], "pir"),
        ("--batch text", ["analyze", one, "-b", "many"], "pir"),
        ("optimize -b 0", ["optimize", one, "-b", "0", "-o", os.path.join(tmp, "b0.json")],
         "pir"),
        ("estimate -b -1", ["estimate", one, "-b", "-1"], "pir"),
        ("unknown subcommand", ["frobnicate", one], "pir"),
        ("unknown flag", ["analyze", one, "--frobnicate"], "pir"),
        ("-o in a missing dir", ["optimize", one, "-o", os.path.join(tmp, "no", "dir", "o.json")],
         "pir"),
        ("-o under a file", ["optimize", one, "-o", os.path.join(blocker, "o.json")], "pir"),
        ("-o unwritable (/proc)", ["optimize", one, "-o", "/proc/memopt_o.json"], "pir"),
        ("-o is the input", ["optimize", one, "-o", one], "pir"),
        ("-o is the input's prefix", ["optimize", one, "-o", one[:-5]], "pir"),
        ("plot -o in a missing dir", ["plot", one, "-o", os.path.join(tmp, "no", "p.png")], "pir"),
        ("plot -o .html", ["plot", one, "-o", os.path.join(tmp, "p.html")], "pir"),
        ("plan -o is the input", ["plan", os.path.join(tmp, "p.csv"), "-o",
                                  os.path.join(tmp, "p.csv")], "pir"),
        ("PIR model, legacy env", ["analyze", one], "legacy"),
        ("legacy model, PIR env", ["analyze", os.path.join(legacy, "static_one.pdmodel")], "pir"),
    ]
    with open(os.path.join(tmp, "p.csv"), "w") as f:
        f.write("id,lower,upper,size\n0,0,3,100\n1,1,4,50\n")
    return cases


def sweep_bad(root, tmp):
    rows = []
    models = [os.path.join(root, ir) for ir in ("pir", "legacy")]
    for case, args, ir in bad_inputs(root, tmp):
        before = [_digest(m) for m in models]
        watched = [a for a in args if os.path.isfile(a)]
        sums = {a: open(a, "rb").read() for a in watched}
        result = cli(*args, *(["-q"] if args[0] != "frobnicate" else []), ir=ir)
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        if case.startswith(("PIR model", "legacy model")):
            verdict = cell(result)  # both IRs load in one process: ok
        elif "Traceback" in result.stderr or result.returncode not in (1, 2):
            verdict = f"BUG: exit {result.returncode}: {(lines or ['-'])[-1][:110]}"
        elif result.returncode == 1 and (len(lines) != 1
                                         or not lines[0].startswith("memopt: error: ")):
            verdict = f"BUG: not one error line: {lines[:2]}"
        elif result.returncode == 2 and not any(" error: " in ln for ln in lines):
            verdict = f"BUG: usage error without a message: {lines[:2]}"
        else:
            verdict = "refused: " + next(ln for ln in lines if " error: " in ln).replace(
                "memopt: error: ", "")[:110]
        changed = [a for a in watched if open(a, "rb").read() != sums[a]]
        if [_digest(m) for m in models] != before or changed:
            verdict = "BUG: the input was overwritten; " + verdict
        rows.append((case, " ".join(os.path.basename(a) if os.sep in a else a for a in args),
                     verdict))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", nargs=2, metavar=("IR", "DIR"),
                        help="save every model of IR under DIR")
    parser.add_argument("--quick-build", action="store_true",
                        help="with --build: no paddle.vision models")
    parser.add_argument("--run", nargs=6, metavar="X",
                        help="run a written model (IR ROOT NAME PREFIX HOW OUT)")
    args = parser.parse_args()
    if args.build:
        return build_models(args.build[0], args.build[1], args.quick_build)
    if args.run:
        return run_model(*args.run)
    parser.error("--build or --run")


if __name__ == "__main__":
    sys.exit(main() or 0)
