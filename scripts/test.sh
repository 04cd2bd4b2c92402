#!/usr/bin/env bash
# Set up, then run the test suite (the CI command).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/setup_engines.sh
exec .venv/bin/python -m pytest -q -n 2 "$@"
