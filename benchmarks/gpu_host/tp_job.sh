#!/usr/bin/env bash
# On a host of two GPUs, after setup.sh (with the Ray part): the tensor-parallel tests one case
# at a time, then e2e.py's TP=2 rows and step profiles (their JSON in LOG_DIR; TP=4 in the
# environment: the rows and profiles at TP=4, on four GPUs), each step's log
# in LOG_DIR/<step>.log and a line per finished step in LOG_DIR/progress. Start it with
# start.sh (a private copy of the checkout, outliving the call); later calls (back to back:
# the host goes back after ~30 s idle) bring LOG_DIR back with poll.sh.
# Usage: bash benchmarks/gpu_host/tp_job.sh LOG_DIR [STEP ...]
#   steps: tests (every case of tests/gpu/test_tensor_parallel_gpu.py), tp-CASE (one of them:
#   dense-g1-fp32, dense-h80-fp32, dense-h80-int8, dense-g1-deferred4, serve), e2e-8b,
#   e2e-8b-bN (its batch-N row alone, e.g. e2e-8b-b1), e2e-9b, e2e-9b-b1 (its B=1 row alone), e2e-9b-b128 (the plugin's 9B B=128 row alone),
#   tree=DIR (that row from the vllm_nemotron_h and benchmarks/e2e.py of another commit,
#   extracted with `git archive C vllm_nemotron_h benchmarks/e2e.py benchmarks/accuracy.py
#   pyproject.toml | tar -x -C DIR` and carried: a before/after on one host), e2e-30b, profile-8b, profile-9b (step_profile.py at TP, B=1 and 128 on one
#   engine, or PROFILE_BATCHES from the environment: each rank's kernels per decode step, both implementations), host-8b-b1 (the
#   8B at B=1 with every rank's host time by op), rank-times-8b-bN (rank_step_times.py: when
#   each rank enters each step of batch N and its host time by runner phase, no profiler,
#   ROUNDS engines each),
#   rank-times-9b-bN (the same for Nano 9B v2, bf16 state, at batch N), plan-tests (on GPU 0:
#   the layer plan's warm launches, the prefill tail's and slot copies' GPU kernel tests, the
#   fp32 engine test, which asserts that no plugin kernel compiles in a request, and the test
#   of Mamba layers sharing a cache group under CUDA graphs); with
#   any step, each GPU's SM clock, power and temperature every second in LOG_DIR/clocks.csv;
#   default tests e2e-8b e2e-9b e2e-30b. ROUNDS=N
#   in the environment: the e2e rows from N engines per implementation, alternating;
#   IMPLS=plugin,builtin: the plugin's engine first (default builtin,plugin: an engine's
#   place in the job is then the other implementation's in the other order).
#   Every engine's log of the tests goes to LOG_DIR/engines.
set -u
out=${1:?usage: tp_job.sh LOG_DIR [STEP ...]}
shift
[ $# -gt 0 ] || set -- tests e2e-8b e2e-9b e2e-30b
. benchmarks/gpu_host/job_lib.sh
export ENGINE_LOG_DIR=$out/engines
tp=${TP:-2}
# results go to LOG_DIR (ignored by git): a later `run` copies the working tree again, which
# resets tracked files under benchmarks/results/ to this checkout's versions
results=$out/e2e-tp$tp-$gpu.json
e2e() {  # ROUNDS in the environment: engines per implementation, alternating (default 1)
  python3 benchmarks/e2e.py --tensor-parallel-size "$tp" --repeats 5 --rounds "${ROUNDS:-1}" \
    --impls "${IMPLS:-builtin,plugin}" --output "$results" "$@"
}
tp_case() {
  step "tp-$1" python3 -m pytest -m gpu tests/gpu/test_tensor_parallel_gpu.py -k "$1" -s \
    -p no:cacheprovider
}
echo "start $(date) $tp x $gpu_name" > "$out/progress"
start_clocks
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
    e2e-8b-b*) step "$s" e2e --models nemotron-h-8b --state-dtypes float32 \
      --batches "${s#e2e-8b-b}" ;;
    e2e-9b) step e2e-9b e2e --models nano-9b-v2 --state-dtypes bfloat16 --batches 1,64,128 ;;
    e2e-9b-b1) step e2e-9b-b1 e2e --models nano-9b-v2 --state-dtypes bfloat16 --batches 1 ;;
    e2e-9b-b128) step e2e-9b-b128 e2e --impls plugin --models nano-9b-v2 --state-dtypes bfloat16 \
      --batches 128 ;;
    tree=*)  # the same row from another commit's package and e2e.py (a `git archive` tree)
      t=${s#tree=}; b=$(basename "$t"); name=$(unique_name "tree-${b#tree-}")
      step "$name" bash -c "cd '$t' && PYTHONPATH=\$PWD:\$PYTHONPATH python3 benchmarks/e2e.py \
        --tensor-parallel-size $tp --repeats 5 --impls plugin --models nano-9b-v2 \
        --state-dtypes bfloat16 --batches 128 --output '$out/e2e-$name.json'" ;;
    e2e-30b) step e2e-30b e2e --models nano-v3-30b --state-dtypes float32 --batches 128 \
      --moe-routing uniform_random ;;
    profile-8b) step profile-8b python3 benchmarks/step_profile.py --model nemotron-h-8b \
      --state-dtype float32 --batches "${PROFILE_BATCHES:-1,128}" --tensor-parallel-size "$tp" \
      --output-dir "$out" ;;
    profile-9b) step profile-9b python3 benchmarks/step_profile.py --model nano-9b-v2 \
      --state-dtype bfloat16 --batches "${PROFILE_BATCHES:-1,128}" --tensor-parallel-size "$tp" \
      --output-dir "$out" ;;
    host-8b-b1) step host-8b-b1 python3 benchmarks/step_profile.py --model nemotron-h-8b \
      --state-dtype float32 --batches 1 --host --tensor-parallel-size "$tp" \
      --output-dir "$out/host" ;;
    rank-times-8b-b*) step "$s" python3 benchmarks/rank_step_times.py \
      --model nemotron-h-8b --state-dtype float32 --batch "${s#rank-times-8b-b}" \
      --tensor-parallel-size "$tp" --rounds "${ROUNDS:-2}" --output-dir "$out" ;;
    rank-times-9b-b*) step "$s" python3 benchmarks/rank_step_times.py --model nano-9b-v2 \
      --state-dtype bfloat16 --batch "${s#rank-times-9b-b}" --tensor-parallel-size "$tp" \
      --rounds "${ROUNDS:-1}" --output-dir "$out" ;;
    plan-tests) step plan-tests env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -s \
      -p no:cacheprovider tests/kernels/test_mamba2_decode.py \
      tests/kernels/test_mamba2_prefill_tail.py tests/kernels/test_state_slot_copy.py \
      tests/gpu/test_engine_gpu.py -k "compiles or prefill_tail or slot_copy or test_fp32_eager or sharing" ;;
    *) echo "unknown step $s" >> "$out/progress" ;;
  esac
done
stop_clocks
echo "end $(date)" >> "$out/progress"
