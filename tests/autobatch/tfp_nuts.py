"""TFP 0.25's auto-batched NUTS (``NoUTurnSampler``), run as a TFP user runs it,
on TFP's own ``auto_batching`` or on autobatch put in its place.

Runs inside TFP's venv (``make tfp`` builds ``.tfp-venv``: TensorFlow 2.18,
TFP 0.25), with autobatch importable (``PYTHONPATH`` at the project root).
``impl="autobatch"`` installs autobatch under TFP's module name
``tensorflow_probability.python.experimental.auto_batching`` before TFP is
imported, so TFP's ``nuts_autobatching.py`` (unmodified) imports autobatch as
``ab``; ``impl="tfp"`` leaves TFP as it is.  One process runs one
implementation.

``python tfp_nuts.py '<json>'`` runs :func:`main` on the settings given and
prints one JSON line: the samples' summary, TFP's own statistical checks of
them (``statistical_testing`` of TFP's NUTS tests), and the samples
themselves when asked (``"return_samples": true``).

Regimes (``"regime"``): ``"eager"`` (TF2, ``sample_chain`` called eagerly),
``"function"`` (inside ``tf.function``), ``"graph"`` (a
``tf.compat.v1.Graph`` run in a ``Session``), ``"xla"``
(``tf.function(jit_compile=True)``).  ``"stackless": true`` uses TFP's
stackless VM (eager only, as in TFP); ``"dry_run": true`` runs NUTS without
auto-batching (``use_auto_batching=False``; one chain).
"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TFP_AB = "tensorflow_probability.python.experimental.auto_batching"
TARGETS = ("normal", "logit_beta", "mvn", "correlated_mvn")


def load(impl):
    """``(tf, tfp, nuts module)``, NUTS importing ``impl``'s auto_batching."""
    if impl == "autobatch":
        import autobatch
        sys.modules[TFP_AB] = autobatch
    elif impl != "tfp":
        raise ValueError(f"impl must be 'tfp' or 'autobatch', got {impl!r}")
    import tensorflow as tf
    import tensorflow_probability as tfp
    from tensorflow_probability.python.experimental.mcmc import nuts_autobatching as nuts
    if impl == "autobatch":
        assert nuts.ab is sys.modules[TFP_AB], "TFP's NUTS did not import autobatch"
    return tf, tfp, nuts


def make_target(tfp, tf, name, dim):
    """``(log_prob, initial sampler, true cdf or None)`` of a target as TFP's
    NUTS tests write it (normal(1, 2); logit of Beta(2, 1); MVN of ``dim``;
    a correlated MVN from a Wishart precision, as in the NUTS paper)."""
    tfd, tfb = tfp.distributions, tfp.bijectors
    if name == "normal":
        def mk():
            return tfd.Normal(loc=1., scale=2.)
    elif name == "logit_beta":
        def mk():
            return tfb.Invert(tfb.Sigmoid())(tfd.Beta(concentration0=1., concentration1=2.))
    elif name == "mvn":
        def mk():
            return tfd.MultivariateNormalDiag(tf.zeros(dim))
    elif name == "correlated_mvn":
        wishart = tfd.WishartTriL(dim, scale_tril=tf.eye(dim), input_output_cholesky=True)
        chol = wishart.sample(seed=7)
        mvn = tfd.TransformedDistribution(
            distribution=tfd.Independent(tfd.Normal(tf.zeros(dim), tf.ones(dim)),
                                         reinterpreted_batch_ndims=1),
            bijector=tfb.Invert(tfb.ScaleMatvecTriL(scale_tril=chol, adjoint=True)))

        def mk():
            return mvn
    else:
        raise ValueError(f"target must be one of {TARGETS}, got {name!r}")

    def log_prob(*args):
        return mk().log_prob(*args)
    return log_prob, mk


def sample(settings):
    """Run NUTS as ``settings`` say; ``(init, samples, leapfrogs, seconds of
    the first call, seconds of a second call or None)``, NumPy arrays."""
    impl = settings["impl"]
    tf, tfp, nuts = load(impl)
    regime = settings.get("regime", "eager")
    chains, steps = int(settings.get("chains", 100)), int(settings.get("steps", 1))
    seed = int(settings.get("seed", 1))
    target = settings.get("target", "normal")
    dim = int(settings.get("dim", 3))
    dry_run = bool(settings.get("dry_run", False))
    stackless = bool(settings.get("stackless", False))
    backend_spec = settings.get("backend")          # autobatch only: its own backends
    if dry_run:
        chains = 1

    def backend():
        if backend_spec is None:
            return None
        import autobatch
        if backend_spec == "numpy":
            return autobatch.NumpyBackend()
        return autobatch.TensorFlowBackend(mode=backend_spec)

    def build():
        log_prob, mk = make_target(tfp, tf, target, dim)
        strm = tfp.util.SeedStream(salt="nuts_parity", seed=seed)
        init = tf.identity(mk().sample([chains], seed=strm()))
        kernel = nuts.NoUTurnSampler(
            log_prob, step_size=float(settings.get("step_size", 0.2)),
            max_tree_depth=int(settings.get("max_tree_depth", 3)),
            unrolled_leapfrog_steps=int(settings.get("unrolled_leapfrog_steps", 2)),
            use_auto_batching=not dry_run, stackless=stackless, backend=backend(),
            seed=strm())

        def chain():
            samples, extra = tfp.mcmc.sample_chain(
                num_results=steps, num_burnin_steps=0, current_state=init, kernel=kernel,
                trace_fn=lambda _, r: r.leapfrogs_taken, parallel_iterations=1)
            return samples, extra
        return init, chain

    times = []
    if regime == "graph":
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.set_random_seed(seed)
            init, chain = build()
            t0 = time.perf_counter()
            out = chain()
            with tf.compat.v1.Session(graph=graph) as sess:
                got = sess.run((init,) + tuple(out))
                times.append(time.perf_counter() - t0)
        return got[0], got[1], got[2], times
    tf.random.set_seed(seed)
    init, chain = build()
    if regime == "eager":
        run = chain
    elif regime in ("function", "xla"):
        run = tf.function(chain, autograph=False, jit_compile=regime == "xla")
    else:
        raise ValueError(f"regime must be eager, function, graph or xla, got {regime!r}")
    for _ in range(int(settings.get("calls", 1))):
        t0 = time.perf_counter()
        samples, leapfrogs = run()
        samples, leapfrogs = samples.numpy(), leapfrogs.numpy()
        times.append(time.perf_counter() - t0)
    return init.numpy(), samples, leapfrogs, times


def dkwm_bound(n, false_fail_rate):
    """The Dvoretzky-Kiefer-Wolfowitz-Massart bound: with probability at least
    ``1 - false_fail_rate`` an empirical CDF of ``n`` samples lies within this
    distance (sup norm) of the true CDF."""
    import numpy as np
    return float(np.sqrt(np.log(2.0 / false_fail_rate) / (2.0 * n)))


def ecdf_distance_to(samples, cdf):
    """``sup |F_n - F|`` of the samples' empirical CDF to ``cdf`` (a function
    of a sorted NumPy array)."""
    import numpy as np
    x = np.sort(np.asarray(samples, np.float64))
    n = len(x)
    f = np.asarray(cdf(x), np.float64)
    upper = np.arange(1, n + 1) / n - f
    lower = f - np.arange(0, n) / n
    return float(max(upper.max(), lower.max()))


def two_sample_distance(a, b):
    """``sup |F_a - F_b|`` of two samples' empirical CDFs."""
    import numpy as np
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / len(a)
    fb = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def checks(settings, init, samples, leapfrogs):
    """The statistical checks of TFP's NUTS tests (``nuts_autobatching_test``),
    written here on the same inequalities (TFP's ``statistical_testing`` is
    not in its wheel): the last step's samples against the target's true CDF
    by the DKWM inequality (univariate targets), or against the initial
    draws, which follow the target, by two-sample DKWM on 100 random
    projections (multivariate; Bonferroni over the projections), at TFP's
    false-fail rate 1e-6; leapfrog counts of the last step that vary and
    average at least 4; the chains move.  ``{name: bool}``, with the
    distances found and the bound they are checked against."""
    import numpy as np
    tf, tfp, _ = load(settings["impl"])
    target = settings.get("target", "normal")
    rate = 1e-6
    last = np.asarray(samples[-1], np.float64)
    first = np.asarray(init, np.float64)
    out = {}
    if target in ("normal", "logit_beta"):
        _, mk = make_target(tfp, tf, target, 1)
        dist = mk()
        distance = ecdf_distance_to(
            last, lambda x: dist.cdf(tf.constant(x, tf.float32)).numpy())
        bound = dkwm_bound(len(last), rate)
        moved = float(np.mean(np.abs(last - first)))
    else:
        rng = np.random.default_rng(0)
        directions = rng.normal(size=(100, last.shape[-1]))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        distance = max(two_sample_distance(last @ d, first @ d) for d in directions)
        # each ECDF within its own DKWM bound, at a rate shared by both and
        # by the 100 projections
        bound = dkwm_bound(len(last), rate / 200) + dkwm_bound(len(first), rate / 200)
        moved = float(np.mean(np.linalg.norm(last - first, axis=-1)))
    out["cdf_distance"], out["cdf_bound"] = distance, bound
    out["cdf_agrees"] = distance <= bound
    # leapfrogs_taken counts from the first step on: the last step's own
    last_step = leapfrogs[-1] - (leapfrogs[-2] if len(leapfrogs) > 1 else 0)
    out["leapfrogs_vary"] = len(np.unique(last_step)) >= 3
    out["leapfrogs_average_4"] = float(np.mean(last_step)) >= 4
    out["moves"] = moved >= 0.2
    return out


def main(settings):
    import numpy as np
    init, samples, leapfrogs, times = sample(settings)
    result = {"shape": list(samples.shape), "dtype": str(samples.dtype),
              "mean": float(np.mean(samples[-1])), "std": float(np.std(samples[-1])),
              "leapfrogs_mean": float(np.mean(leapfrogs)), "seconds": times}
    if settings.get("check"):
        result["checks"] = checks(settings, init, samples, leapfrogs)
    if settings.get("return_samples"):
        result["samples"] = samples.tolist()
        result["leapfrogs"] = leapfrogs.tolist()
    return result


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
