"""Eager execution: one ATen call at a time.

``executor`` runs a call: ``key`` describes it, ``parity`` applies CPU's
checks on a cache miss, ``build`` makes its program, and the launcher
installed by ``modes`` runs it (``strict``, ``debug`` or ``fused``).
"""
