#!/usr/bin/env bash
# On a host of four GPUs, after setup.sh (with the Ray part): two tp_job.sh at once, one on
# GPUs 0-1 and one on GPUs 2-3, each with its own Triton and vLLM compile caches (e2e.py
# counts a run's compiles from its caches: the other job's must not land there), then, once
# both ended, one at TP=4 on all four. Only the second pair may use Ray (one Ray cluster per
# host), and nothing else may hold memory on their GPUs: each engine asks for 0.9 of its
# GPU at start and fails below it. The pairs share the host's CPUs: a lone prompt's or a
# small batch's rate, bound by host time, is best measured in the TP=4 list or alone.
# LOG_DIR/pair01, pair23 and tp4 are tp_job.sh's LOG_DIRs; LOG_DIR/progress gets "end" when
# all is done. Start it with start.sh as tp_job.sh.
# Usage: bash benchmarks/gpu_host/pairs.sh LOG_DIR "STEPS on GPUs 0-1" "STEPS on GPUs 2-3" \
#   ["STEPS at TP=4"]     e.g. pairs.sh L "e2e-8b e2e-9b" "tests" "e2e-8b"
set -u
out=${1:?usage: pairs.sh LOG_DIR STEPS01 STEPS23 [STEPS_TP4]}
mkdir -p "$out"
echo "start $(date)" > "$out/progress"
pair() {  # pair GPUS NAME STEPS
  # shellcheck disable=SC2086  # STEPS is a list of words
  CUDA_VISIBLE_DEVICES=$1 TRITON_CACHE_DIR=/root/cache-$2/triton \
    VLLM_CACHE_ROOT=/root/cache-$2/vllm bash benchmarks/gpu_host/tp_job.sh "$out/$2" $3
  echo "$2 ended $(date)" >> "$out/progress"
}
pair 0,1 pair01 "$2" &
pair 2,3 pair23 "$3" &
wait
# shellcheck disable=SC2086
[ -z "${4:-}" ] || TP=4 bash benchmarks/gpu_host/tp_job.sh "$out/tp4" $4
echo "end $(date)" >> "$out/progress"
