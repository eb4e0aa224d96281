"""Backends of the batched VM: NumPy (:mod:`.numpy`) and TensorFlow (:mod:`.tf`);
:mod:`.default` picks one for a call's arguments."""
