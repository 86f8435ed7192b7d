# Sourced by gpu_job.sh and tp_job.sh after they set $out (their LOG_DIR): vLLM's environment,
# this checkout on PYTHONPATH, the GPU's name ($gpu_name) and short tag ($gpu: h100, h200 or
# the name in lower case, as results files are named), and step NAME CMD... (runs CMD with its
# output in $out/NAME.log, then appends "NAME rc=.. Ns from HH:MM:SS" (its start, host time, as
# clocks.csv's timestamps) to $out/progress; a step named
# again is NAME-2, NAME-3, ...: unique_name); start_clocks / stop_clocks: each GPU's SM and
# memory clock, power, temperature and utilisation every second in $out/clocks.csv while the
# job runs (whether a slow engine ran on a slowed GPU; poll.sh brings it back compressed).
mkdir -p "$out"
. /root/vllm-env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
gpu_name=$(python3 -c "import torch; print(torch.cuda.get_device_name())")
gpu=$(python3 -c "import sys; n = sys.argv[1]
print(next((t.lower() for t in ('H100', 'H200') if t in n), n.replace(' ', '_').lower()))" \
  "$gpu_name")
unique_name() {  # NAME, or NAME-2, NAME-3, ... where a step of that name already ran
  local n=$1 i=2
  while [ -e "$out/$n.log" ]; do n=$1-$i; i=$((i + 1)); done
  echo "$n"
}
step() {
  local step_name; step_name=$(unique_name "$1"); shift
  local t0; t0=$(date +%s)
  "$@" > "$out/$step_name.log" 2>&1
  echo "$step_name rc=$? $(( $(date +%s) - t0 ))s from $(date -d "@$t0" +%H:%M:%S)" \
    >> "$out/progress"
}
start_clocks() {
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
    --format=csv -l 1 > "$out/clocks.csv" 2>&1 &
  clocks_pid=$!
}
stop_clocks() { kill "$clocks_pid"; }
