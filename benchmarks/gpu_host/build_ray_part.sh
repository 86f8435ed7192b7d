#!/usr/bin/env bash
# Run on a machine with PyPI access, after ../shared/gpu-vllm/build_bundle.sh .gpuenv.
# Writes .gpuenv/ray-part (about 23 MB): Ray (trimmed: no Java jars, no dashboard web build,
# no RLlib/Tune/Train/Data/Serve/LLM libraries, none of which vLLM's Ray executor imports)
# and the wheels Ray needs that the GPU host lacks, plus install_ray.sh beside it.
# Usage: bash benchmarks/gpu_host/build_ray_part.sh [.gpuenv]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:-.gpuenv}" && cd "${1:-.gpuenv}" && pwd)
work=$(mktemp -d)
plats=""; for n in 39 38 36 35 34 31 28 27 24 17; do plats="$plats --platform manylinux_2_${n}_x86_64"; done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $plats \
  --platform manylinux2014_x86_64 -d "$work/dl" "ray==2.60.0"
mkdir -p "$work/ray/wheels" "$work/unzipped"
(cd "$work/unzipped" && unzip -q "$work"/dl/ray-*.whl)
rm -rf "$work"/unzipped/ray/{jars,rllib,tune,train,data,serve,llm} "$work/unzipped/ray/dashboard/client/build"
(cd "$work/unzipped" && tar -cf - ray ray-*.dist-info | xz -T0 -9 > "$work/ray/ray-slim.tar.xz")
find "$work/dl" -name '*.whl' ! -name 'ray-*' -exec cp {} "$work/ray/wheels/" \;
(cd "$work" && tar -cf "$out/ray-part" ray)
cp "$here/install_ray.sh" "$out/"
rm -rf "$work"
ls -la "$out/ray-part"
