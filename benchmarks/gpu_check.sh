#!/usr/bin/env bash
# The GPU check of the intervention op (issues 20, 32), for a machine with an NVIDIA GPU. Run from
# the repository root:   bash benchmarks/gpu_check.sh [OUT_DIR] [STAGES]
# STAGES: a comma list of 1, 2, 3 (default: all). Each stage runs under its own time limit,
# prints PASS/FAIL lines and writes OUT_DIR/stageN.log and OUT_DIR/stageN.json (default OUT_DIR:
# ./gpu-check); a stage past its limit is a FAIL and keeps its log. Exit 1 on any FAIL.
#   1. torch and Triton alone (benchmarks/gpu_check.py --stage 1, limit 150 s): the fused kernel's
#      parity with the reference, nothing written at rest, a CUDA graph that follows new indices,
#      the op in torch.compile, 1 launch per layer call; then (1b, limit 150 s) the op in a
#      stand-in model, eager, inductor and a replayed CUDA graph (benchmarks/gpu_op_check.py);
#   2. torch, Triton and transformers alone (benchmarks/gpu_check.py --stage 2, limit 300 s): the
#      op's cost on a Llama-3.1-8B-shaped model (random bf16 weights, no download) under CUDA
#      graphs at decode batch 1, 32 and 128 and a prefill of 8,192 tokens, paired against the
#      same model without the op (benchmarks/gpu_check_model.py);
#   3. only where vLLM is importable (a venv from scripts/bootstrap-venv.sh): the engine parity
#      tests on the V1 runner in vLLM's default compilation (piecewise and full CUDA graphs;
#      ACS_GPU_CHECK_MODES adds eager, piecewise or full), the V2 runner forced on the wide
#      scenarios, and the overhead benchmark against plain vLLM (6 rounds). Limits 240, 150 and
#      200 s; each engine's log is kept under OUT_DIR/stage3-*.
# Stages 1 and 2 are what a bare CUDA machine (no vLLM, no network) can run, in about 3 minutes
# on an H100 by arithmetic (not yet run on one); with stage 3, about 8. On a CPU:
# `python -m benchmarks.gpu_check --interpret` (stage 1) and `--tiny` (stage 2), as the tests do.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
STAGES=",${2:-1,2,3},"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
stage() { echo; echo "=== $* ($(date +%T))"; }
wants() { [[ $STAGES == *",$1,"* ]]; }
# A part of stage 3: its own limit (a backstop of 30 s past it kills what is left), its log kept.
part() {  # NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  timeout -k 30 "$limit" "$@" > >(tee "$OUT/stage3-$name.log") 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then echo "PASS stage 3 $name"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "FAIL stage 3 $name past its limit ($limit s)"
  else echo "FAIL stage 3 $name (exit $rc; $OUT/stage3-$name.log)"; fi
  results+=("\"$name\": $rc")
  [ $rc -eq 0 ] || status=1
}

stage "0. the machine"
nvidia-smi -L || { echo "FAIL no NVIDIA GPU"; exit 1; }
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

if wants 1; then
  stage "1. the fused kernel (torch and Triton)"
  timeout -k 30 180 $PY -m benchmarks.gpu_check --stage 1 --limit 150 "$OUT" || status=1
  stage "1b. the op in a stand-in model (torch)"
  timeout -k 30 150 $PY -m benchmarks.gpu_op_check 2>&1 | tee "$OUT/stage1b.log" || status=1
fi

if wants 2; then
  stage "2. the op's cost on a Llama-3.1-8B-shaped model (torch, Triton, transformers)"
  timeout -k 30 330 $PY -m benchmarks.gpu_check --stage 2 --limit 300 "$OUT" || status=1
fi

wants 3 || exit $status
if ! $PY -c 'import vllm' 2>/dev/null; then
  stage "3 skipped: vLLM is not importable with $PY (build .venv with scripts/bootstrap-venv.sh)"
  echo '{"stage": "stage3", "skipped": "vLLM is not importable"}' > "$OUT/stage3.json"
  exit $status
fi
$PY -c 'import vllm; print("vllm", vllm.__version__)'
results=()

stage "3a. engine parity, V1 runner: ${ACS_GPU_CHECK_MODES:-compiled}"
# One engine at a time (each driver is its own process), so each takes vLLM's default share of
# the GPU; the preemption scenario sizes its KV cache in tokens, for 16-token blocks here.
ACS_HOOK_ENGINE_MODES=${ACS_GPU_CHECK_MODES:-compiled} part parity 240 $PY -m pytest \
  tests/e2e/test_hooks_engine.py -q -p no:cacheprovider -x --basetemp "$OUT/stage3-parity"

stage "3b. the V2 model runner forced: engine parity, wide scenarios, default compilation"
VLLM_USE_V2_MODEL_RUNNER=1 ACS_HOOK_ENGINE_MODES=compiled part parity_v2 150 $PY -m pytest \
  tests/e2e/test_hooks_engine.py -q -p no:cacheprovider -x -k "not chunk and not preemption" \
  --basetemp "$OUT/stage3-v2"
if grep -rqs --include='*.log' "V2 model runner" "$OUT/stage3-v2"; then
  echo "PASS stage 3 the workers ran on the V2 model runner"
else
  echo "FAIL stage 3 no engine log says V2 model runner: see $OUT/stage3-v2"; status=1
fi

stage "3c. overhead against plain vLLM, compiled (6 rounds; three engines share the GPU)"
ACS_BENCH_ROUNDS=6 part overhead 200 $PY -m benchmarks.hook_overhead

(IFS=,; echo "{\"stage\": \"stage3\", \"exit_codes\": {${results[*]}}}") > "$OUT/stage3.json"
exit $status
