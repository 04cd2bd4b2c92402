#!/usr/bin/env bash
# The full OpInfo conformance sweep: every op_db entry on tpu vs CPU; writes docs/op_coverage.md.
# Options: see `./scripts/op_conformance.sh --help` (tests/conformance/sweep.py).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
PYTHONPATH=tests exec .venv/bin/python -m conformance.sweep "$@"
