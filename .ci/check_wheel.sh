#!/usr/bin/env bash
# The package as users get it: build the sdist and wheel, install the wheel
# into a fresh venv with NumPy only (no source tree on the path), import both
# packages and run the command line; then add the `paddle` extra and run one
# memory_optimize on a small program.
#
#   .ci/check_wheel.sh [PYTHON]   PYTHON makes the fresh venv (default python3);
#   BUILD_PYTHON runs `python -m build` (default .venv/bin/python).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-python3}"
WORK="$(mktemp -d)"
export GLOG_minloglevel=2 PIP_DISABLE_PIP_VERSION_CHECK=1
trap 'rm -rf "$WORK"' EXIT

"${BUILD_PYTHON:-$ROOT/.venv/bin/python}" -m build --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; exit 1; }
ls "$WORK"/dist/memopt-*.tar.gz >/dev/null
WHEEL="$(ls "$WORK"/dist/memopt-*.whl)"

"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/python" -m pip install -q --upgrade pip
"$V/python" -m pip install -q "$WHEEL"
cd "$WORK"            # away from the source tree: what is imported is the wheel's
"$V/python" - <<'PY'
import importlib.metadata as md
import sys

import autobatch
import memopt

assert "site-packages" in memopt.__file__, memopt.__file__
assert autobatch.__version__ == memopt.__version__ == md.version("memopt")
extra = sorted(n for n in ("paddle", "tensorflow", "jax", "numba", "matplotlib")
               if n in sys.modules)
assert not extra, f"import memopt/autobatch pulled in {extra}"
print("wheel: memopt", memopt.__version__, "imports with NumPy only")
PY
"$V/memopt" --version
"$V/memopt" plan "$ROOT/examples/buffers.csv"

"$V/python" -m pip install -q "$WHEEL[paddle]"
"$V/python" - <<'PY'
import numpy as np
import paddle

import memopt

paddle.enable_static()
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [-1, 16], "float32")
    h = paddle.nn.functional.relu(paddle.static.nn.fc(x, 32))
    loss = paddle.mean(paddle.static.nn.fc(h, 1))
    paddle.optimizer.SGD(0.1).minimize(loss)
report = memopt.memory_optimize(main, fetch_list=[loss])
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
(value,) = exe.run(main, feed={"x": np.ones((4, 16), "float32")}, fetch_list=[loss])
assert np.isfinite(value).all()
print("wheel + paddle: memory_optimize ran,", len(report.reuses), "reuses; loss", float(value))
PY
