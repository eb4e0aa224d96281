"""PIR programs (``paddle.pir.Program``) <-> memopt: reading a program into the
neutral graph, the in-place rewrite and its record, level 2's order, recomputation
to a budget.  Importing this package does not import Paddle; its modules do.
"""
