"""The design's walls: the core and both packages import without Paddle or
TensorFlow, and memopt never imports autobatch."""
import subprocess
import sys

CORE = ["memopt", "memopt.graph", "memopt.liveness", "memopt.reuse", "memopt.arena",
        "memopt.bounds", "memopt.simulate", "memopt.problems", "autobatch",
        "autobatch.instructions", "autobatch.allocation_strategy",
        "autobatch.virtual_machine", "autobatch.backends.numpy"]


def test_core_imports_neither_paddle_nor_tensorflow():
    code = ("import sys, importlib\n"
            f"for m in {CORE!r}: importlib.import_module(m)\n"
            "import memopt, autobatch\n"
            "for n in memopt.__all__: getattr(memopt, n)\n"
            "bad = [m for m in ('paddle', 'tensorflow') if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_memopt_does_not_import_autobatch():
    code = ("import sys, importlib, pkgutil, memopt\n"
            "for m in pkgutil.walk_packages(memopt.__path__, 'memopt.'):\n"
            "    if m.name.split('.')[-1] not in ('cli',): importlib.import_module(m.name)\n"
            "print('autobatch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
