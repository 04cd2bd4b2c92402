"""Placeholder until this part lands: the command says so instead of pretending."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("rest", nargs="*")


def run(args) -> int:
    raise SystemExit("torchtpu tune analyze: not built yet")
