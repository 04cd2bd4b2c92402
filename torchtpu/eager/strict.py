"""Strict eager, the default launcher: run each program now, asynchronously.

jax dispatch returns before the device finishes, so the Python program runs
ahead until something reads a value on the host.
"""

from __future__ import annotations


class StrictLauncher:
    name = "strict"
    defers = False  # programs run as they come; nothing is ever pending

    def launch(self, program, dynamic):
        return program(*dynamic)

    def flush(self, cause=None) -> None:
        pass
