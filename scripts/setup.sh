#!/usr/bin/env bash
# Create .venv with the pinned torch (CPU build), jax and torchtpu itself. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if ! .venv/bin/python -c "import torchtpu, pytest, xdist, hypothesis, transformers, accelerate, peft, matplotlib; from torchtpu.runtime import native; assert native.module; from importlib.metadata import entry_points as e; assert e(group='sglang.srt.platforms', name='torchtpu')" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check -e ".[test]"
fi
