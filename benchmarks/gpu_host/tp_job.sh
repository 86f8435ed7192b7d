#!/usr/bin/env bash
# On a host of two GPUs, after setup.sh (with the Ray part): the tensor-parallel tests one case
# at a time, then e2e.py's TP=2 rows and step profiles (their JSON in LOG_DIR), each step's log
# in LOG_DIR/<step>.log and a line per finished step in LOG_DIR/progress. Start it with
# `setsid nohup ... &` so that it outlives the call; later calls (back to back: the host goes
# back after ~30 s idle) read LOG_DIR, e.g.
#   while ! grep -q '^end' LOG_DIR/progress; do sleep 10; done  (bounded by the call's limit)
# Usage: bash benchmarks/gpu_host/tp_job.sh LOG_DIR [STEP ...]
#   steps: tests (every case of tests/gpu/test_tensor_parallel_gpu.py), tp-CASE (one of them:
#   dense-g1-fp32, dense-h80-fp32, dense-h80-int8, dense-g1-deferred4, serve), e2e-8b,
#   e2e-9b, e2e-30b, profile-8b, profile-9b (step_profile.py at TP=2, B=128: each rank's
#   kernels per decode step, both implementations); default tests e2e-8b e2e-9b e2e-30b.
#   Every engine's log of the tests goes to LOG_DIR/engines.
set -u
out=${1:?usage: tp_job.sh LOG_DIR [STEP ...]}
shift
[ $# -gt 0 ] || set -- tests e2e-8b e2e-9b e2e-30b
mkdir -p "$out"
. /root/vllm-env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} ENGINE_LOG_DIR=$out/engines
# results go to LOG_DIR (ignored by git): a later `run` copies the working tree again, which
# resets tracked files under benchmarks/results/ to this checkout's versions
gpu=h200
python3 -c "import torch; print(torch.cuda.get_device_name())" | grep -q H100 && gpu=h100
results=$out/e2e-tp2-$gpu.json
step() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" >> "$out/progress"
}
e2e() {
  python3 benchmarks/e2e.py --tensor-parallel-size 2 --repeats 5 --output "$results" "$@"
}
tp_case() {
  step "tp-$1" python3 -m pytest -m gpu tests/gpu/test_tensor_parallel_gpu.py -k "$1" -s \
    -p no:cacheprovider
}
echo "start $(date)" > "$out/progress"
for s in "$@"; do
  case $s in
    tests)
      # the one-group case first: its path exists on GPUs for tensor parallel alone (each
      # engine times out with its log after the test's ENGINE_TIMEOUT_S)
      for c in dense-g1-fp32 dense-h80-fp32 dense-h80-int8 dense-g1-deferred4 serve; do
        tp_case "$c"
      done ;;
    tp-*) tp_case "${s#tp-}" ;;
    e2e-8b) step e2e-8b e2e --models nemotron-h-8b --state-dtypes float32 --batches 1,64,128 ;;
    e2e-9b) step e2e-9b e2e --models nano-9b-v2 --state-dtypes bfloat16 --batches 1,64,128 ;;
    e2e-30b) step e2e-30b e2e --models nano-v3-30b --state-dtypes float32 --batches 128 \
      --moe-routing uniform_random ;;
    profile-8b) step profile-8b python3 benchmarks/step_profile.py --model nemotron-h-8b \
      --state-dtype float32 --batch 128 --tensor-parallel-size 2 \
      --output "$out/step-profile-nemotron-h-8b-float32-b128-tp2-$gpu.json" ;;
    profile-9b) step profile-9b python3 benchmarks/step_profile.py --model nano-9b-v2 \
      --state-dtype bfloat16 --batch 128 --tensor-parallel-size 2 \
      --output "$out/step-profile-nano-9b-v2-bfloat16-b128-tp2-$gpu.json" ;;
    *) echo "unknown step $s" >> "$out/progress" ;;
  esac
done
echo "end $(date)" >> "$out/progress"
