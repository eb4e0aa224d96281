"""Fixtures for tests, benchmarks and sweeps (as ``numpy.testing``): the bundled
models and the distributed runs.  Not part of the planning library: no module of
memopt outside this package and the ``memopt`` command imports it.
"""
