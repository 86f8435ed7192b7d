#!/usr/bin/env bash
# On the GPU host, in the checkout root, in the `run` that carries the last vLLM part
# (see README.md beside this file). Installs vLLM 0.26.0 from the stashed parts, Ray if its
# part came along, and this project (for its entry point). Afterwards, in the same command:
#   . /root/vllm-env.sh && export PYTHONPATH=$PWD:$PYTHONPATH
set -eu
bash .gpuenv/stash.sh .gpuenv > /dev/null
[ -e /root/vllm-site/vllm/__init__.py ] || bash .gpuenv/install.sh
. /root/vllm-env.sh
if [ -e .gpuenv/ray-part ] && ! python3 -c "import ray" 2>/dev/null; then
  bash .gpuenv/install_ray.sh .gpuenv/ray-part
fi
# py-spy (paired_engines.py --host-samples: gpu_job.sh host-samples-M), where its wheel came along
for wheel in .gpuenv/py_spy-*.whl; do
  [ -e "$wheel" ] || continue
  python3 -c "import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
open('/root/py-spy', 'wb').write(z.read(next(n for n in z.namelist() if n.endswith('/py-spy'))))" \
    "$wheel"
  chmod +x /root/py-spy
done
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /root/vllm-site .
python3 -c "import torch; print(torch.cuda.device_count(), 'x', torch.cuda.get_device_name())"
