#!/usr/bin/env bash
# On the GPU host, after ../shared/gpu-vllm's install.sh: unpack the carried .gpuenv/ray-part
# into /root/vllm-site (where vLLM went; /root/vllm-env.sh already puts it on PYTHONPATH).
# Usage: bash .gpuenv/install_ray.sh .gpuenv/ray-part
set -eu
work=$(mktemp -d)
tar -xf "$1" -C "$work"
tar -xJf "$work/ray/ray-slim.tar.xz" -C /root/vllm-site
# Only the dependencies the host lacks: a copy in /root/vllm-site would shadow the host's own.
missing=()
for w in "$work"/ray/wheels/*.whl; do
  dist=$(basename "$w" | cut -d- -f1)
  python3 -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null \
    || missing+=("$w")
done
[ ${#missing[@]} -eq 0 ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --target /root/vllm-site "${missing[@]}"
rm -rf "$work"
. /root/vllm-env.sh
python3 -c "import ray; print('ray', ray.__version__)"
