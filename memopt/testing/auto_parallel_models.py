"""Auto-parallel training programs (``paddle.distributed.to_static``) on a CPU.

For tests, :mod:`memopt.testing.dist_runs` and the README.  A two-layer MLP
(``features`` -> ``hidden`` -> 1, ReLU, mean squared error, SGD) is handed to
``paddle.distributed.to_static`` on a one-dimensional ``ProcessMesh`` of the
ranks:

``"mp"``  tensor parallel: the first weight (and bias) column-sharded
          (``Shard(1)``), the second row-sharded (``Shard(0)``); the
          reshard pass inserts a forward ``pd_op.all_reduce`` (partial sums).
``"dp"``  data parallel: the batch dimension sharded by
          ``paddle.distributed.shard_dataloader``; the reshard pass inserts
          gradient ``pd_op.all_reduce`` ops and a ``pd_op.all_gather``.
``"pp"``  the two layers on two one-rank meshes (``[0]`` and ``[1]``), the
          hidden activation resharded from one to the other: the cut
          pipeline parallel makes; the reshard pass inserts
          ``pd_op.send_v2`` / ``pd_op.recv_v2``.  Built, not run: its
          parameter initialisation (``DistModel.train()``) dies with a
          segmentation fault in ``paddle.reshard`` (C++ stack:
          ``phi::distributed::GetDefaultPlace`` ->
          ``phi::DeviceManager::GetDeviceCount``); :func:`skip_initialisation`
          lets ``train()`` return with the programs built.

The DistModel's PIR program after the parallel passes (what each rank runs,
``engine._pir_dense_main_progs["train"]``) and, captured on the way, the
program before the reshard pass (``dist_op.reshard`` ops, ``pd_dist`` types).

What Paddle 3.3.1 on a CPU build does (measured here, 2 ranks spawned with
gloo), and what :func:`install_cpu_patches` changes so the programs run:

- ``DistModel.dist_main_program()`` before ``train()``: ``KeyError: None``
  (the programs are built lazily, by ``train()``).
- ``train()`` builds and parallelises the programs, then instantiates the
  reshard pass's process groups: ``AssertionError: No CUDA device found``
  (``ProcessGroup.instantiate``: NCCL, BKCL or a custom device only).  Patched:
  a gloo communication context per group (``CommContextManager.
  create_gloo_comm_context``, keyed by the group id the ops' ``ring_id``
  names; group 0 is ``init_parallel_env``'s).
- Then the parameter initialisation's ``barrier``: ``(Unavailable)
  NCCLCommContext is nullptr, collective op should has ring_id attr``
  (``barrier_kernel.cc:32``).  Patched: ``paddle.distributed.barrier()``.
- ``shard_dataloader`` with numpy 2: ``TypeError: only 0-dimensional arrays
  can be converted to Python scalars`` (``ProcessMesh.
  get_rank_by_dim_and_process_id``: ``int()`` of a one-element array).
  Patched: the element.

With those the programs train on two CPU ranks (their ``pd_op.all_reduce`` /
``pd_op.all_gather`` run on gloo).
"""
from __future__ import annotations

MODES = ("mp", "dp", "pp")


def install_cpu_patches() -> dict:
    """Patch Paddle (this process, for good) so that ``to_static`` programs
    run on CPU ranks with gloo (see the module docstring).  Returns a dict
    that collects, under ``"before_reshard"``, a clone of each program the
    reshard pass is applied to (the main program first)."""
    import numpy as np
    import paddle
    import paddle.distributed as dist
    from paddle.base import core
    from paddle.distributed.auto_parallel import process_mesh
    from paddle.distributed.auto_parallel.static import pir_pass, process_group

    captured: dict = {"before_reshard": []}

    def instantiate(self):
        if self._is_instantiate:
            return
        rank = dist.get_rank()
        if self.nranks >= 2 and rank in self.ranks and self.id != 0:
            core.CommContextManager.create_gloo_comm_context(
                core.create_or_get_global_tcp_store(), str(self.id),
                self.local_rank(rank), self.nranks)
        self._is_instantiate = True

    def rank_by_dim(self, dim, process_id):
        if dim is None:  # as Paddle's: every process's rank is 0
            return 0
        name = dim if isinstance(dim, str) else self._dim_names[dim]
        where = np.where(self._mesh == process_id)[self._dim_names.index(name)]
        return int(where[0])

    reshard = pir_pass.ReshardPasses.apply_reshard_pass

    def capture(program, *args, **kwargs):
        captured["before_reshard"].append(program.clone())
        return reshard(program, *args, **kwargs)

    process_group.ProcessGroup.instantiate = instantiate
    process_mesh.ProcessMesh.get_rank_by_dim_and_process_id = rank_by_dim
    pir_pass.ReshardPasses.apply_reshard_pass = staticmethod(capture)
    paddle._legacy_C_ops.barrier = lambda *a, **k: dist.barrier()
    return captured


def _dataset(samples: int, features: int, seed: int = 3):
    import numpy as np
    import paddle

    class Data(paddle.io.Dataset):
        def __init__(self):
            rng = np.random.RandomState(seed)
            self.x = rng.rand(samples, features).astype("float32")
            self.y = rng.rand(samples, 1).astype("float32")

        def __getitem__(self, i):
            return self.x[i], self.y[i]

        def __len__(self):
            return samples

    return Data()


def build(mode: str = "mp", *, nranks: int = 2, features: int = 16, hidden: int = 32,
          batch: int = 8, samples: int = 64, seed: int = 1, strategy=None):
    """``(dist_model, loader)``: the MLP handed to ``paddle.distributed.
    to_static`` (dygraph mode, ``init_parallel_env`` done, the patches
    installed), not yet prepared (call ``dist_model.train()``).
    ``strategy``: a ``paddle.distributed.Strategy`` for ``to_static``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    import paddle
    import paddle.distributed as dist

    paddle.seed(seed)
    mesh = dist.ProcessMesh(list(range(nranks)), dim_names=["x"])
    stages = [dist.ProcessMesh([r], dim_names=["x"]) for r in range(nranks)]

    class MLP(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.l1 = paddle.nn.Linear(features, hidden)
            self.l2 = paddle.nn.Linear(hidden, 1)
            if mode == "mp":
                self.l1.weight = dist.shard_tensor(self.l1.weight, mesh, [dist.Shard(1)])
                self.l1.bias = dist.shard_tensor(self.l1.bias, mesh, [dist.Shard(0)])
                self.l2.weight = dist.shard_tensor(self.l2.weight, mesh, [dist.Shard(0)])
            elif mode == "pp":
                for layer, stage in ((self.l1, stages[0]), (self.l2, stages[-1])):
                    layer.weight = dist.shard_tensor(layer.weight, stage, [dist.Replicate()])
                    layer.bias = dist.shard_tensor(layer.bias, stage, [dist.Replicate()])

        def forward(self, x):
            h = paddle.nn.functional.relu(self.l1(x))
            if mode == "pp":
                h = dist.reshard(h, stages[-1], [dist.Replicate()])
            return self.l2(h)

    model = MLP()
    opt = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    loader = paddle.io.DataLoader(_dataset(samples, features), batch_size=batch,
                                  shuffle=False)
    if mode == "dp":
        loader = dist.shard_dataloader(loader, meshes=[mesh], shard_dims="x")
    elif mode == "pp":
        loader = dist.shard_dataloader(loader, meshes=[stages[0], stages[-1]])
    return dist.to_static(model, loader, paddle.nn.MSELoss(), opt, strategy=strategy), loader


def skip_initialisation() -> None:
    """Make ``DistModel.train()`` build the programs but not initialise the
    parameters (``Engine._initialize``), for the ``"pp"`` programs, which
    cannot be run here (see the module docstring).  This process, for good."""
    from paddle.distributed.auto_parallel.static import engine

    engine.Engine._initialize = lambda self, *args, **kwargs: None


def main_program(dist_model):
    """The rank's PIR program after the parallel passes (what it runs)."""
    return dist_model._engine._pir_dense_main_progs["train"]


def parameters(program, scope=None) -> list:
    """``[(name, ndarray)]`` of the program's parameters (``builtin.parameter``
    ops) from ``scope`` (default: the global scope), sorted by name."""
    import numpy as np
    import paddle

    scope = scope or paddle.static.global_scope()
    names = sorted(op.attrs()["parameter_name"] for op in program.global_block().ops
                   if op.name() == "builtin.parameter")
    return [(name, np.array(scope.find_var(name).get_tensor())) for name in names]


def op_names(program) -> list:
    """Every op name of the program's blocks (nested regions included)."""
    out = []

    def walk(block):
        for op in block.ops:
            out.append(op.name())
            for region in op.regions() if hasattr(op, "regions") else ():
                for sub in region.blocks():
                    walk(sub)

    walk(program.global_block())
    return out


def inplace_on_communication(program) -> list:
    """Ops memopt made in place (``memopt_inplace`` attribute) that read or
    write a value a communication op of ``program`` reads or writes: names,
    program order (none expected)."""
    from ..paddle.distributed import is_communication

    def values(op):
        return [op.operand_source(i) for i in range(op.num_operands())] + list(op.results())

    ops = list(program.global_block().ops)
    comm = {id_ for op in ops if is_communication(op.name())
            for id_ in (v.id for v in values(op) if v.initialized())}
    return [op.name() for op in ops if op.has_attr("memopt_inplace")
            and any(v.initialized() and v.id in comm for v in values(op))]
