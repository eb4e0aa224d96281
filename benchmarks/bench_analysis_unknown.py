"""memopt.analyze's predicted peak on programs memopt's own models do not build.

The programs a new user brings: ``paddle.vision`` ResNet-18 and
MobileNetV3-small, an ``nn.TransformerEncoder`` (dropout on) and an
``nn.LSTM`` classifier, as static training programs (built with the layers
in ``program_guard``, an optimizer's ``minimize``) and as inference
programs (``paddle.jit.save`` of the dygraph model, read back with
``paddle.static.load_inference_model``); PIR (Paddle 3's default) and
legacy (``FLAGS_enable_pir_api=0``; ``paddle.jit.save`` of the transformer
and the LSTM fails there in Paddle 3.3.1, so legacy has fewer rows), with
the garbage collector on (the default) and off
(``FLAGS_eager_delete_tensor_gb=-1``).

Each configuration runs in a fresh process: ``memopt.analyze(program,
batch, fetch_list=...)`` predicts the peak of the step's non-persistable
memory (``Analysis.peak``); then 5 steps run on Paddle's CPU executor, each
measured as ``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)``
(reset before the step) minus what was allocated before the first step
(parameters, optimizer state).  The first step is a warm-up, shown apart
(``step 1``): Paddle builds the executor's instructions while it runs it,
and the legacy executor's first step measures the same with the garbage
collector on and off (a legacy MobileNetV3 inference step with
``FLAGS_eager_delete_tensor_gb=-1``: 3.1 MB in step 1, 25.0 MB from step 2
on, predicted 25.0 MB).  ``ratio`` is predicted / the lowest of steps 2-5 (the garbage
collector frees on its own thread and the executor runs independent ops on
4 threads, so on a loaded machine a step's peak is raised by the lag and
the overlap: the lowest step is the one closest to the model).

Usage::

    python benchmarks/bench_analysis_unknown.py              # every row
    python benchmarks/bench_analysis_unknown.py --programs resnet18_train --gc off

Prints a markdown table.
"""
import argparse
import json
import os
import sys
import tempfile

import _bench

#: steps run; the first is a warm-up, reported apart: the figures are the
#: lowest and the median of the other 4
STEPS = 5
#: program -> (kind, batch size, IRs it is built in)
PROGRAMS = {
    "resnet18_train": ("train", 16, ("pir", "legacy")),
    "mobilenet_train": ("train", 16, ("pir", "legacy")),
    "transformer_train": ("train", 32, ("pir",)),
    "lstm_train": ("train", 64, ("pir", "legacy")),
    "resnet18_infer": ("infer", 16, ("pir", "legacy")),
    "mobilenet_infer": ("infer", 16, ("pir", "legacy")),
    "transformer_infer": ("infer", 32, ("pir",)),
    "lstm_infer": ("infer", 64, ("pir",)),
}
IMAGE = 64
SEQ, D_MODEL, VOCAB = 16, 64, 1000


def _layers(name: str):
    """(dygraph/static layer constructor, input shape without the batch, dtype)."""
    import paddle
    from paddle import nn

    class LSTMClassifier(nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 64)
            self.lstm = nn.LSTM(64, 128)
            self.fc = nn.Linear(128, 5)

        def forward(self, x):
            h, _ = self.lstm(self.emb(x))
            return self.fc(h[:, -1])

    from memopt.testing.encoders import encoder_layer

    def Encoder():
        return encoder_layer(d_model=D_MODEL, d_ff=4 * D_MODEL, classes=10)

    base = name.split("_")[0]
    return {
        "resnet18": (lambda: paddle.vision.models.resnet18(num_classes=10),
                     [3, IMAGE, IMAGE], "float32", 10),
        "mobilenet": (lambda: paddle.vision.models.mobilenet_v3_small(num_classes=10),
                      [3, IMAGE, IMAGE], "float32", 10),
        "transformer": (Encoder, [SEQ, D_MODEL], "float32", 10),
        "lstm": (LSTMClassifier, [20], "int64", 5),
    }[base]


def _train_program(name: str):
    import paddle

    ctor, shape, dtype, classes = _layers(name)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, *shape], dtype)
        y = paddle.static.data("y", [None, 1], "int64")
        loss = paddle.nn.functional.cross_entropy(ctor()(x), y).mean()
        optimizer = (paddle.optimizer.Adam(1e-3) if "transformer" in name
                     else paddle.optimizer.Momentum(1e-3))
        optimizer.minimize(loss)
    return main, startup, [loss], (shape, dtype, classes)


def _infer_program(name: str, exe, workdir: str):
    import paddle
    from paddle.static import InputSpec

    ctor, shape, dtype, classes = _layers(name)
    paddle.disable_static()
    layer = ctor()
    layer.eval()
    prefix = os.path.join(workdir, name)
    paddle.jit.save(layer, prefix, input_spec=[InputSpec([None, *shape], dtype, "x")])
    paddle.enable_static()
    program, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
    return program, fetches, (shape, dtype, classes)


def _feed(rng, batch: int, shape, dtype, classes: int, train: bool) -> dict:

    if dtype == "int64":
        x = rng.integers(0, VOCAB, size=(batch, *shape)).astype("int64")
    else:
        x = rng.standard_normal((batch, *shape)).astype(dtype)
    feed = {"x": x}
    if train:
        feed["y"] = rng.integers(0, classes, size=(batch, 1)).astype("int64")
    return feed


def worker(name: str) -> dict:
    import numpy as np
    import paddle
    from paddle.base import core

    import memopt

    kind, batch, _ = PROGRAMS[name]
    paddle.seed(0)
    paddle.enable_static()
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), tempfile.TemporaryDirectory() as workdir:
        if kind == "train":
            program, startup, fetches, (shape, dtype, classes) = _train_program(name)
            exe.run(startup)
        else:
            program, fetches, (shape, dtype, classes) = _infer_program(name, exe, workdir)
        predicted = memopt.analyze(program, batch, fetch_list=fetches).peak(batch)
        rng = np.random.default_rng(0)
        peaks = []
        # what the step adds to the parameters (and state) set up before it; with
        # GC off a step's values stay in the scope after it, so not per step
        base = core.host_memory_stat_current_value("Allocated", 0)
        for _ in range(STEPS):
            feed = _feed(rng, batch, shape, dtype, classes, kind == "train")
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            exe.run(program, feed=feed, fetch_list=fetches)
            peaks.append(core.host_memory_stat_peak_value("Allocated", 0) - base)
    return {"predicted": int(predicted), "peaks": [int(p) for p in peaks]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--programs", nargs="+", choices=sorted(PROGRAMS), default=list(PROGRAMS))
    parser.add_argument("--irs", nargs="+", choices=("pir", "legacy"), default=["pir", "legacy"])
    parser.add_argument("--gc", nargs="+", choices=("on", "off"), default=["on", "off"])
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0])))
        return
    table = _bench.Table(["program", "IR", "GC", "batch", "predicted MiB", "measured lowest MiB",
                          "measured median MiB", "ratio", "step 1 MiB"], "lllrrrrrr")
    for name in args.programs:
        kind, batch, irs = PROGRAMS[name]
        for ir in (i for i in args.irs if i in irs):
            for gc in args.gc:
                env = {"FLAGS_enable_pir_api": "1" if ir == "pir" else "0",
                       "FLAGS_eager_delete_tensor_gb": "0" if gc == "on" else "-1"}
                result = _bench.run_worker(__file__, [name], env=env)
                if "error" in result:
                    table.row(name, ir, gc, batch, result["error"], "", "", "", "")
                    continue
                first, steps = result["peaks"][0], result["peaks"][1:]
                low, med = min(steps), _bench.median(steps)
                table.row(name, ir, gc, batch, f"{_bench.mib(result['predicted']):.2f}",
                          f"{_bench.mib(low):.2f}", f"{_bench.mib(med):.2f}",
                          f"{result['predicted'] / low:.3f}" if low else "-",
                          f"{_bench.mib(first):.2f}")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
