"""What runs between the public entry points (:mod:`memopt.api`) and the
adapters: one pipeline per IR (:mod:`memopt.pipeline.legacy`,
:mod:`memopt.pipeline.pir`: read -> plan -> check -> apply -> report), the
analysis of a program (:mod:`memopt.pipeline.analysis`), the facts
:func:`memopt.estimate` needs (:mod:`memopt.pipeline.facts`) and the checked
arguments (:mod:`memopt.pipeline.arguments`).  The pipelines wire the
adapters to the planner; which one runs is :mod:`memopt.policy`'s choice.
"""
