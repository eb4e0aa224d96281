"""Legacy programs (``paddle.base.framework.Program``) <-> memopt: reading a
program into the neutral graph, the rewrite that merges variables and its record,
level 2's order, recomputation to a budget, deployment.  Importing this package
does not import Paddle; its modules do.
"""
