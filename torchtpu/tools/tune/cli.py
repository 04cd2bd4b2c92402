"""``torchtpu tune <command>``: each command is a module (``MODULES``) with ``add_arguments(parser)`` and ``run(args)``."""

from __future__ import annotations

import argparse
import importlib

MODULES = {"analyze": "diagnose", "cost": "cost", "plan": "plan", "search": "search"}
COMMANDS = {
    "analyze": "diagnose a script: recompiles, graph breaks, host syncs, fallbacks, dimensions, memory",
    "cost": "predict a compiled step's time on a TPU generation; calibrate on this machine",
    "plan": "rank sharding plans for a model on N chips and print the scaling curve",
    "search": "try settings in subprocesses, measure each, keep the best as a profile",
}


def add_commands(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="tune_command", required=True)
    for name, help_text in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(tune_module=MODULES[name])
        sub.set_defaults(fn=run)
        _module(MODULES[name]).add_arguments(sub)  # cheap: each module imports only the standard library at its top


def _module(name: str):
    return importlib.import_module(f"torchtpu.tools.tune.{name}")


def run(args: argparse.Namespace) -> int:
    return _module(args.tune_module).run(args)
