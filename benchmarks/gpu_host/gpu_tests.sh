#!/usr/bin/env bash
# On the GPU host, after setup.sh and `. /root/vllm-env.sh`: the engine tests of
# tests/gpu/test_engine_gpu.py in groups that run at the same time on one GPU (the tests fix
# their KV cache size instead of profiling free memory, so their engines can share it).
# Each group's pytest log goes to LOG_DIR/engine-<n>.log; exits non-zero if any group failed.
# Usage: bash benchmarks/gpu_host/gpu_tests.sh LOG_DIR [-k EXPRESSION per group ...]
set -u
out=${1:?usage: gpu_tests.sh LOG_DIR [EXPRESSION ...]}
shift
mkdir -p "$out"
# every test in exactly one group
[ $# -gt 0 ] || set -- "test_fp32_eager or deferred or mtp" \
  "(int8 and not ngram) or (prefix and not deferred) or sharing" "bf16 or ngram or fp8" "moe"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
pids=()
n=0
for expression in "$@"; do
  python3 -m pytest -m gpu tests/gpu/test_engine_gpu.py -k "$expression" -s -p no:cacheprovider \
    > "$out/engine-$n.log" 2>&1 &
  pids+=($!)
  n=$((n + 1))
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
tail -n 3 "$out"/engine-*.log
exit $status
