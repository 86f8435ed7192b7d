#!/usr/bin/env bash
# On the GPU host, in the checkout root, after setup.sh: copies the checkout to a private tree
# and starts a job script there in the background, outliving the call. A job must not run from
# the host's checkout: every later `run` copies the working tree into it again, and a job
# importing the package while that happens fails (No module named ...).
# Usage: bash benchmarks/gpu_host/start.sh NAME SCRIPT [ARG ...]
#   e.g. start.sh tp benchmarks/gpu_host/tp_job.sh /root/jA e2e-8b
#   the tree is /root/tree-NAME, the script's output /root/NAME.out
set -eu
name=${1:?usage: start.sh NAME SCRIPT [ARG ...]}
shift
tree=/root/tree-$name
rm -rf "$tree" && mkdir -p "$tree"
tar --exclude=./.gpuenv --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C "$tree"
cd "$tree"
setsid nohup bash "$@" > "/root/$name.out" 2>&1 < /dev/null &
echo "started $* in $tree (pid $!)"
