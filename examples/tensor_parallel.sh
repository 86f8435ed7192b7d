#!/usr/bin/env bash
# Tensor parallel with the plugin.
#   GPUs (Ray):  vllm serve CHECKPOINT --tensor-parallel-size 2 --distributed-executor-backend ray
#   CPU:         one core per worker must be bound, as below (multiprocessing executor).
# Usage: examples/tensor_parallel.sh [CHECKPOINT] [more vllm serve options...]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-.cache/tiny-models/dense}
shift || true
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)" 2>/dev/null; then
  exec examples/serve.sh "$MODEL" --tensor-parallel-size 2 --distributed-executor-backend ray "$@"
fi
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-"0|1"}
exec examples/serve.sh "$MODEL" --tensor-parallel-size 2 "$@"
