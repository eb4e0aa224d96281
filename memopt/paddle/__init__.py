"""Adapters between Paddle programs and the neutral :mod:`memopt.graph` model.

Importing this package does not import Paddle; its modules do.
"""
