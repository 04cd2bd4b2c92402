#!/usr/bin/env bash
# Set up, then train a small GPT on the tpu device and print a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/torchtpu demo "$@"
