"""memopt and autobatch: memory planning for ML programs, and auto-batching."""
from setuptools import find_packages, setup

PADDLE = ["paddlepaddle==3.3.1"]
TF = ["tensorflow>=2.16"]
TEST = ["pytest>=7", "hypothesis>=6"]
PLOT = ["matplotlib>=3.6"]
# Compiles the arena planner's search kernel (memopt/_search_kernel.py): the
# exact and default modes run it about two orders of magnitude faster than
# the same code as plain Python, which is what runs without numba.
FAST = ["numba>=0.60"]
# autobatch.JaxBackend: programs without calls compiled by JAX into one XLA
# loop (the fastest engine for uniform loops; recursion stays on the VM).
JAX = ["jax[cpu]>=0.4.30"]

setup(
    name="memopt",
    version="0.1.0",
    description="Memory planning for ML programs (Paddle memory_optimize, "
                "arena planning) and an auto-batching engine",
    long_description=open("README.rst", encoding="utf-8").read(),
    long_description_content_type="text/x-rst",
    python_requires=">=3.10",
    packages=find_packages(include=["memopt", "memopt.*", "autobatch", "autobatch.*"]),
    package_data={"memopt": ["py.typed"], "autobatch": ["py.typed"]},
    include_package_data=True,
    install_requires=["numpy>=1.23"],
    extras_require={
        "paddle": PADDLE,
        "tf": TF,
        "plot": PLOT,
        "fast": FAST,
        "jax": JAX,
        "test": TEST + PLOT,
        "all": PADDLE + TF + TEST + PLOT + FAST + JAX,
    },
    entry_points={"console_scripts": ["memopt = memopt.cli:main"]},
)
