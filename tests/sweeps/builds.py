"""Building a sweep's PIR model: ``(main, startup, feed, fetch)`` from a
``{name: (batch, builder)}`` table, and the parameters of a PIR program in
the order it declares them (Paddle's parameter names are not stable across
two builds: compare them by position)."""


def build_pir_model(models: dict, name: str):
    """``(main, startup, feed, fetch)`` of ``models[name]`` (a ``(batch,
    builder)`` pair whose builder returns ``(feed, fetch)``), built as a PIR
    program with Paddle's seed 7."""
    import paddle

    paddle.seed(7)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        feed, fetch = models[name][1]()
    return main, startup, feed, fetch


def pir_parameter_names(program) -> list:
    """The parameters of a PIR ``program``, in the order it declares them."""
    return [op.attrs()["parameter_name"] for op in program.global_block().ops
            if op.name() == "builtin.parameter"]
