#!/usr/bin/env bash
# Every GPU check of radio-lit in one call, in order of importance, each step's output kept in
# OUTDIR (default: gpu-session/): benchmarks/gpu_check.py (every shipped config built and
# stepped: gpu_check.txt), `radio-lit plan` of every config it stepped beside what it measured
# (plan_check.txt, on the host's CPUs), this GPU's calibration (calibration.yaml: `radio-lit plan
# --calibrate`) and the plan priced on it (plan_check_calibrated.txt), the `gpu` tests (gpu_tests.txt), radio-lit's
# stage-1 step against a plain PyTorch loop (train_step.txt), then what CUDA holds at AM-RADIO
# stage 2's memory peak (memory_at_peak.txt, the plan's open question). Each step has its own
# time limit, so that one that hangs leaves the others their time; about 14 minutes in all on
# one H200 before memory_at_peak (up to 150 s more).
#
#   bash benchmarks/gpu_session.sh [OUTDIR]
#
# On a machine without radio-lit's dependencies and no package index, put their wheels in a
# folder and name it: WHEELS=path/to/wheels bash benchmarks/gpu_session.sh (installed with
# --no-deps into a temporary folder put first on PYTHONPATH; nothing else is changed).
# PYTHON names the interpreter (default: python3).
set -u
py=${PYTHON:-python3}
out=${1:-gpu-session}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d)
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl \
    || { echo "gpu_session: the wheels in $WHEELS did not install"; exit 2; }
  export PYTHONPATH="$site:$PYTHONPATH"
fi
start=$(date +%s)
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep and show the output's end
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(($(date +%s) - start)) s in)"
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "exit $?" >> "$out/$name.txt"
  tail -n 45 "$out/$name.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$py" -c "import torch, lightning, timm, transformers; print('torch', torch.__version__, \
'lightning', lightning.__version__, 'timm', timm.__version__, 'transformers', transformers.__version__)"
  git log -1 --format='radio-lit %h' 2>/dev/null; } > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
step gpu_check 330 "$py" benchmarks/gpu_check.py --budget 270
case "$(head -n 1 "$out/machine.txt")" in  # the plan's device for gpu_check's card
  *H200*) gpu=h200 ;; *H100*) gpu=h100 ;; *A100*) gpu=a100 ;; *B200*) gpu=b200 ;; *) gpu=h200 ;;
esac
step plan_check 300 "$py" benchmarks/plan_check.py "$out/gpu_check.txt" --gpu "$gpu"
# this GPU's curves (radio-lit plan --calibrate: GEMMs, attention, bandwidth, reference steps),
# then the same plan against gpu_check.py's measurements priced on them
step calibrate 240 "$py" -m radio_lit plan --calibrate "$out/calibration.yaml"
step plan_check_calibrated 300 "$py" benchmarks/plan_check.py "$out/gpu_check.txt" --gpu "$gpu" \
  --calibration "$out/calibration.yaml"
step gpu_tests 120 "$py" -m pytest -m gpu -q -rA -p no:cacheprovider $(grep -rl "mark.gpu" tests)
step train_step 150 "$py" benchmarks/train_step.py --config configs/stage1.yaml --device cuda --teacher-depth 8
# what CUDA holds at AM-RADIO stage 2's peak, by allocation site: the plan is 13 % under there
step memory_at_peak 150 "$py" benchmarks/memory_at_peak.py --config recipes/am-radio/stage2.yaml --device cuda
# every rank busy: packed vs per-resolution vs padded at C-RADIOv4's ViT-H/16 (head dim 80), and the
# kernel crossover by sequence length at head dims 80 and 72 (SO400M): model.student_packing.measured
step packing 150 "$py" benchmarks/packing.py --device cuda --dtype bfloat16 --model vit_huge_patch16_224 \
  --depth 8 --low 16 --high 2 --low-res 256 --high-res 768 --head-dims 80 72 --heads 16 \
  --lengths 256 1024 4096 --total 16384
echo "== done in $(($(date +%s) - start)) s; outputs in $out/"
