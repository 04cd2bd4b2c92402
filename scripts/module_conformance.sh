#!/usr/bin/env bash
# The full module conformance sweep: every ModuleInfo entry on tpu vs CPU; writes docs/module_coverage.md.
# Options: see `./scripts/module_conformance.sh --help` (tests/conformance/module_sweep.py).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
PYTHONPATH=tests exec .venv/bin/python -m conformance.module_sweep "$@"
