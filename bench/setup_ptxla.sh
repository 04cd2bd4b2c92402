#!/usr/bin/env bash
# Make .venv-ptxla: PyTorch/XLA 2.9 (torch 2.9, a multi-GB download) for bench/ptxla_peer.py. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv-ptxla/bin/python ] || "$PYTHON" -m venv .venv-ptxla
if ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv-ptxla/bin/python -c "import torch_xla, transformers" 2>/dev/null; then
  .venv-ptxla/bin/pip install --quiet --disable-pip-version-check "torch==2.9.0" "torch_xla==2.9.0" \
    "transformers>=5.16.1,<5.20"
fi
