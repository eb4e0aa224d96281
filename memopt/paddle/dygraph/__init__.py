"""nn.Layer models and ``paddle.jit.to_static`` steps.

Paddle is imported inside the functions.  Modules:

- :mod:`memopt.paddle.dygraph.to_static`: ``memory_optimize`` on a to_static
  step (every training program it builds rewritten before its first run);
- :mod:`memopt.paddle.dygraph.hook`: the hook Paddle calls on each training
  program, and the checks of the Paddle internals it relies on.
"""
