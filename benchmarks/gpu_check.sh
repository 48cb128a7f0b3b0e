#!/usr/bin/env bash
# The GPU check of capture and steering inside vLLM's compiled engines (issue 20), for a machine
# with an NVIDIA GPU. Meant to finish in under 8 minutes. Run from the repository root:
#   bash benchmarks/gpu_check.sh [OUT_DIR]
# Stages (each prints its own PASS/FAIL lines and figures; logs go to OUT_DIR, default ./gpu-check):
#   1. the op's fused Triton kernel, with torch and Triton alone (benchmarks/gpu_check.py, which
#      writes OUT_DIR/stage1.log and stage1.json): parity with the reference, nothing written at
#      rest, a CUDA graph that follows new indices, the op in torch.compile, 1 launch per layer
#      call; then the op in a stand-in model: eager, inductor and a replayed CUDA graph agree, and
#      what the op costs at rest (benchmarks/gpu_op_check.py);
#   2. with vLLM installed (a venv from scripts/bootstrap-venv.sh, which takes vLLM's GPU build on
#      a machine with nvidia-smi): the engine parity tests in eager mode, vLLM's default
#      compilation (piecewise and full CUDA graphs) and each CUDA-graph mode alone;
#   3. the V2 model runner forced (VLLM_USE_V2_MODEL_RUNNER=1): the same engine parity tests in
#      eager mode and vLLM's default compilation (the V2 runner is hooked, but vLLM's CPU build
#      cannot run it: this is its first check in an engine), and the worker's log says V2;
#   4. the overhead benchmark against plain vLLM in its default compiled mode (fewer rounds).
# Stage 1 needs only torch, Triton, numpy and this checkout (`python -m benchmarks.gpu_check
# --interpret` runs its kernel part on a CPU, as the test suite does); stages 2-4 are skipped, and
# say so, where vLLM is not importable (a device machine that reaches no package index).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
stage() { echo; echo "=== $* ($(date +%T))"; }

stage "0. the machine"
nvidia-smi -L || { echo "FAIL no NVIDIA GPU"; exit 1; }
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

stage "1. the fused kernel (torch and Triton)"
timeout 240 $PY -m benchmarks.gpu_check "$OUT" || status=1
stage "1b. the op in a stand-in model (torch)"
timeout 240 $PY -m benchmarks.gpu_op_check 2>&1 | tee "$OUT/op_check.log" || status=1

if ! $PY -c 'import vllm' 2>/dev/null; then
  stage "2-4 skipped: vLLM is not importable with $PY (build .venv with scripts/bootstrap-venv.sh)"
  exit $status
fi
$PY -c 'import vllm; print("vllm", vllm.__version__)'

stage "2. engine parity: eager, default compiled (CUDA graphs), piecewise, full"
ACS_HOOK_ENGINE_MODES=eager,compiled,piecewise,full timeout 300 $PY -m pytest \
  tests/e2e/test_hooks_engine.py -q -p no:cacheprovider -x 2>&1 | tee "$OUT/parity.log" || status=1

stage "3. the V2 model runner forced: engine parity, eager and default compiled"
# The engines' logs land under pytest's --basetemp: each worker says which runner it hooked.
VLLM_USE_V2_MODEL_RUNNER=1 ACS_HOOK_ENGINE_MODES=eager,compiled timeout 240 $PY -m pytest \
  tests/e2e/test_hooks_engine.py -q -p no:cacheprovider -x --basetemp "$OUT/v2" 2>&1 \
  | tee "$OUT/parity_v2.log" || status=1
if grep -rqs --include='*.log' "V2 model runner" "$OUT/v2"; then
  echo "PASS the workers ran on the V2 model runner"
else
  echo "FAIL no engine log says V2 model runner: see $OUT/v2"; status=1
fi

stage "4. overhead against plain vLLM, compiled (8 rounds)"
ACS_BENCH_ROUNDS=8 timeout 240 $PY -m benchmarks.hook_overhead 2>&1 | tee "$OUT/overhead.log" \
  || status=1
exit $status
