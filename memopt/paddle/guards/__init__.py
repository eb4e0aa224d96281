"""Checks memopt hooks into Paddle so that a rewritten program cannot be
misused silently: a fetch or feed of a variable a rewrite renamed away or
wrote over, Paddle's lookup by name of a renamed variable, a
``CompiledProgram`` or ``translate_to_pir`` of a rewritten legacy desc.
:mod:`memopt.paddle.guards.install` puts them in.  Importing this package
does not import Paddle; its modules do.
"""
