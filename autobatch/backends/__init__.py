"""Backends of the batched VM: NumPy (:mod:`.numpy`) and TensorFlow (:mod:`.tf`)."""
