#!/usr/bin/env bash
# On a host of one GPU, after setup.sh: benchmark steps run one after another in the
# background, each step's log in LOG_DIR/<step>.log, its JSON in LOG_DIR, and a line per
# finished step in LOG_DIR/progress, the GPU's clocks in LOG_DIR/clocks.csv (start it with
# start.sh, poll it with poll.sh).
# Usage: bash benchmarks/gpu_host/gpu_job.sh LOG_DIR STEP ...
#   kernels     the GPU kernel tests (pytest -m gpu tests/kernels) with this GPU's launch table
#   tune-K      tune.py for kernel K (selective_state_update, mamba2_decode,
#               causal_conv1d_update, deferred_state_update) on the 8B and 9B shapes, every
#               state format, into LOG_DIR/tune-K.json
#   tune-tpN-K  the same for one rank's shapes at TP=N, B=1 and 2: the batch x heads
#               below TP=1's B=1 (TP=4, 8B at B=1: 32), into LOG_DIR/tune-tpN-K.json
#   tables      this GPU's launch tables from LOG_DIR/tune-*.json and the committed sweep's
#               rows of the same kernels (benchmarks/results/kernel-tuning-<gpu>.json, if
#               any), merged into the package's file (kernels and keys not swept stay) and
#               copied to LOG_DIR with the merged sweep (tune-tp* sweeps left out)
#   tables-tp   LOG_DIR/tune-tp*.json's rows in front of the file's (smaller points)
#   e2e-30b-S   Nemotron 3 Nano 30B-A3B, state dtype S (bfloat16, float32), B=1/32/128,
#               $ROUNDS rounds (default 2), both implementations routed by vLLM's uniform
#               routing simulation (random weights route by the tokens each generates), into
#               LOG_DIR/e2e-30b-uniform-routing-<gpu>.json
#   profile-30b one decode step of the 30B at B=1 and 128 (bf16 state), both implementations,
#               routed as e2e-30b-S
#   kernels-vllm the GPU kernel tests that import vLLM (the fused decode tail, speculative)
#   accuracy-int8 accuracy.py on the shipped model, fp32 and int8 state, every decode step
#               through the state-update kernel (--fused-max-batch-heads 0), then through the
#               device table's paths (the fused tail at small batch x heads)
#   accuracy-deferred accuracy.py on the shipped model: fp32, then fp32, bf16 and int8 with
#               deferred writes (ring 16), every decode step through the state update
#               (--fused-max-batch-heads 0: the deferred kernel), into
#               LOG_DIR/accuracy-deferred-<gpu>.json
#   e2e-int8-M  model M (8b or 9b): the built-in with fp32 and bf16 state, then the plugin
#               with int8 state, B=1/32/128/256, separate processes: tokens/s and how many
#               sequences each format's cache holds, into LOG_DIR/e2e-int8-<gpu>.json
#   host-layout the host's time by op of one decode step, plain and with ngram (3 drafts), on
#               the layout-8b preset (the 8B's layers at tiny widths: a step is host time)
#   e2e-ngram-8b the 8B with fp32 state and ngram (3 drafts) at B=1 and 32, 2 rounds, then the
#               host profile of one such step at B=1 (both implementations)
#   pairs-ngram-8b the 8B with fp32 state and ngram (3 drafts) at B=1 and 32, both engines
#               alive on the one GPU and timed run by run ($PAIRS alternating pairs, default 10:
#               e2e.py --pairs), into LOG_DIR/e2e-8b-fp32-ngram3-pairs-<gpu>.json
#   pairs-9b    the same for Nano 9B v2, bf16 state, no speculation, B=1 and 128, into
#               LOG_DIR/e2e-9b-bf16-pairs-<gpu>.json
#   steps-ngram-8b per engine step (no profiler) the host and device time of the 8B's ngram steps
#               at B=1 and 32 by CUDA-graph mode, with the host time of the runner's phases and
#               of each metadata builder (rank_step_times.py at TP=1, ~3.5 min a batch)
#   steps-ttft-M a lone 128-token prompt's prefill step and the decode steps after it, model M
#               (8b or 9b, bf16 state, B=1), host time by runner phase, 3 engines each
#               alternating (rank_step_times.py: where the time to first token goes)
#   ttft-M      model M's time to first token and decode at B=1/32/128 (bf16 state), 3 rounds
#               of alternating engines (e2e.py), into LOG_DIR/e2e-M-bf16-ttft-rounds3-<gpu>.json
#   paired-M    model M (8b or 9b), bf16 state: both implementations as two engines of one
#               process, batches of B=1/32/128 alternating between them (paired_engines.py:
#               time to first token and decode without the engine processes' spread; every
#               paired step also the GPU's clocks in each engine's turns), into
#               LOG_DIR/paired-engines-<gpu>.json
#   paired-reversed-M the same with the plugin's engine first, vLLM's second: which of the two
#               an engine's place in the process favours
#   paired-control-M the same with one implementation in both engines (vLLM's, then the
#               plugin's): how far an engine's position in the process moves its times
#   The B=1-only steps below build their engines as paired-M does (--engine-batches
#   1,32,128: the lone 128-token prompt replays the piecewise graphs captured for 128
#   tokens; engines built for B=1 alone run it without graphs, another regime):
#   paired-profile-M the pair at B=1 (PAIRED_BATCHES in the environment: those batches, e.g.
#               32,128; PAIR=plugin,builtin: the plugin's engine first) with one time to first
#               token of each engine profiled per batch (kernels by category, host ops by self
#               time), into LOG_DIR/paired-engines-profile-<gpu>.json
#   host-samples-M the pair (vLLM's engine first) at B=1, its 20 first-token and 2 whole-run
#               pairs sampled by py-spy (setup.sh installs it where its wheel was carried):
#               each engine's host time per call by function, into
#               LOG_DIR/paired-engines-host-samples-<gpu>.json (the raw stacks beside it)
#   host-phases-M the pair (vLLM's engine first; host-phases-reversed-M the plugin's) at B=1
#               (PAIRED_BATCHES: those batches) with each engine's 20 first-token steps timed
#               by host phase, unprofiled (the runner's phases, each metadata builder, the
#               Mamba layers' ops, the time outside the worker), into
#               LOG_DIR/paired-engines-host-phases-<gpu>.json
#   scan-host   the host time of one layer's prefill scan, vLLM's wrapper through its
#               autotuners against the plugin's tuned launches (8B and 9B shapes, 1 and 32
#               prompts of 128 tokens), then the boundary tests on this vLLM (the scan's
#               equality) and the engine tests through prefills (fp32 tokens against
#               transformers and the built-in; prefix caching in 'align' on the plugin,
#               whose prefills start from cached states, and in 'all' on vLLM's model),
#               into LOG_DIR/prefill-scan-host-time-<gpu>.json
#   scan-tuning the boundary tests on this vLLM (the scan's tuning among them), then one layer's
#               prefill scan of 1 / 32 / 128 prompts with the configs tuned at one chunk
#               (vLLM's warm-up) against those tune_scan chooses, 3 trials each (8B and 9B
#               shapes), into LOG_DIR/prefill-scan-tuning-<gpu>.json
#   scan-tuning-start tune_scan's cost to an engine start, three starts (processes) on one new
#               Triton cache directory per model, then two more with a Triton kernel launched
#               first (scan_tuning_start.py): the first start tunes, later ones load its
#               choices, into LOG_DIR/scan-tuning-start[-warm-triton]-<gpu>.json
#   prefix-caching-tests the engine tests with prefix caching alone (each Mamba cache mode
#               where it runs; deferred writes' rings through cached blocks)
#   model-drafts-tests the engine tests of drafts from a model (MTP layers, a draft model in
#               its own KV-cache group) verified by the plugin with CUDA graphs
#   ngram-tests the engine tests of ngram drafts verified by the plugin with CUDA graphs (fp32
#               and int8 state; vLLM's model reported beside)
#   serving-tests the server's reliability and serve tests on this GPU (tiny fp32 model through
#               examples/serve.sh: concurrent load, disconnecting clients, preemption, bad
#               requests, completions against offline), their rows in LOG_DIR/reliability/;
#               then serve-defaults
#   serve-defaults examples/serve.sh with vLLM's defaults (what `make serve` starts), alone
#   preemption-tests the preemption tests alone (RELIABILITY_SEED from the environment, if set),
#               then again with Triton's fp32 dots in IEEE fp32 (TRITON_F32_DEFAULT=ieee; by
#               default they round their inputs to TF32, vLLM's prefill scan among them):
#               whether a recomputed sequence parts from its run alone by the prefill's TF32;
#               then vLLM's own model through the per-step case (the control). PREEMPTION_F32
#               names the precisions to run (default "tf32 ieee"), PREEMPTION_CONTROL=0 leaves
#               the control out (the tests as CI would run them: PREEMPTION_F32=tf32)
#   serve-load-8b `vllm serve` with the plugin against the built-in's server, 8B shape, fp32
#               state, 128 concurrent streams: the project's client, then `vllm bench serve`
#               on the same server ($ROUNDS servers of each, alternating; default 1, ~8 min
#               a round), into LOG_DIR/serve-load-nemotron-h-8b-float32-<gpu>.json
#   boundary-tests tests/test_vllm_boundary.py on this vLLM (the touchpoints' contracts, the
#               scan's tuned launches against vLLM's own)
#   int8-floor  the int8 state format's bytes moved without arithmetic (int8_state_floor.py)
#   deferred-floor a deferred step's bytes moved without arithmetic (deferred_state_floor.py),
#               int8 / bf16 / fp32 checkpoints
#   deferred-choice the engine tests of deferred writes (the per-step update where the device
#               table says deferring does not pay, the fused tail, eager = CUDA graphs), then
#               the 8B's int8 state with and without deferred writes (plugin, B=32/128, the
#               table's choice end to end) into LOG_DIR/e2e-8b-int8-deferred-choice-<gpu>.json
set -u
out=${1:?usage: gpu_job.sh LOG_DIR STEP ...}
shift
. benchmarks/gpu_host/job_lib.sh
sweep=$out/kernel-tuning-$gpu.json
# the pairs read the job's clock log: the GPU's clocks in each engine's turns
paired=(python3 benchmarks/paired_engines.py --clocks "$out/clocks.csv")
merge_sweeps() {  # this job's sweeps, then the committed sweep's rows of the kernels they tune
  python3 -c "import json, os, sys
new = sum((json.load(open(p)) for p in sys.argv[3:] if 'tune-tp' not in p), [])
kernels = {r['kernel'] for r in new}
old = json.load(open(sys.argv[2])) if os.path.exists(sys.argv[2]) else []
json.dump([r for r in old if r['kernel'] in kernels] + new, open(sys.argv[1], 'w'), indent=1)" \
    "$sweep" "benchmarks/results/kernel-tuning-$gpu.json" "$out"/tune-*.json
}
boundary_tests() {  # the vLLM boundary's contracts and its GPU cases on this vLLM
  step boundary-tests python3 -m pytest -q -p no:cacheprovider tests/test_vllm_boundary.py
}
serve_defaults() {  # alone: vLLM's default memory share leaves no room for another engine
  step serve-defaults python3 -m pytest -q -p no:cacheprovider tests/test_serve.py -k vllm_defaults
}
shape_of() {  # a step named ...-8b runs Nemotron-H 8B's shape, ...-9b Nano 9B v2's
  case $1 in *-8b) echo nemotron-h-8b ;; *-9b) echo nano-9b-v2 ;; esac
}
echo "start $(date) $gpu_name" > "$out/progress"
start_clocks
for s in "$@"; do
  case $s in
    kernels) step kernels python3 -m pytest -m gpu tests/kernels -q -p no:cacheprovider ;;
    tune-tp*)  # tune-tpN-K: one rank's shapes at TP=N, B=1 and 2 (points below TP=1's)
      rank=${s#tune-tp}
      step "$s" python3 benchmarks/kernels/tune.py --models nemotron-h-8b,nano-9b-v2 \
        --kernels "${rank#*-}" --state-dtypes float32,bfloat16,int8 --batches 1,2 \
        --tensor-parallel-size "${rank%%-*}" --output "$out/$s.json" ;;
    tune-*) step "$s" python3 benchmarks/kernels/tune.py --models nemotron-h-8b,nano-9b-v2 \
      --kernels "${s#tune-}" --state-dtypes float32,bfloat16,int8 --output "$out/$s.json" ;;
    tables)
      merge_sweeps
      step tables python3 benchmarks/kernels/tune.py --tables "$sweep" --write "$gpu_name"
      cp "vllm_nemotron_h/ops/configs/$(echo "$gpu_name" | tr ' ' '_').json" "$out/" ;;
    tables-tp)
      for f in "$out"/tune-tp*.json; do
        step "tables-$(basename "$f" .json)" python3 benchmarks/kernels/tune.py --tables "$f" \
          --write "$gpu_name" --in-front
      done
      cp "vllm_nemotron_h/ops/configs/$(echo "$gpu_name" | tr ' ' '_').json" "$out/" ;;
    e2e-30b-bfloat16|e2e-30b-float32) step "$s" python3 benchmarks/e2e.py --models nano-v3-30b \
      --state-dtypes "${s#e2e-30b-}" --batches 1,32,128 --repeats 3 --rounds "${ROUNDS:-2}" \
      --moe-routing uniform_random --output "$out/e2e-30b-uniform-routing-$gpu.json" ;;
    profile-30b) step profile-30b python3 benchmarks/step_profile.py --model nano-v3-30b \
      --state-dtype bfloat16 --batches 1,128 --moe-routing uniform_random --output-dir "$out" ;;
    kernels-vllm) step kernels-vllm python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/kernels/test_mamba2_decode.py tests/kernels/test_mamba2_speculative_decode.py ;;
    accuracy-int8)
      acc=(python3 benchmarks/accuracy.py --formats fp32,int8 --contexts 512,2048 --windows 16
        --kl-windows 8 --greedy-prompts 16 --greedy-tokens 512 --no-reference)
      step accuracy-int8-state-update "${acc[@]}" --fused-max-batch-heads 0 \
        --output "$out/accuracy-int8-state-update-$gpu.json"
      step accuracy-int8-table "${acc[@]}" --output "$out/accuracy-int8-table-$gpu.json" ;;
    accuracy-deferred) step accuracy-deferred python3 benchmarks/accuracy.py \
      --formats fp32,fp32-deferred16,bf16-deferred16,int8-deferred16 --contexts 2048 \
      --windows 8 --kl-windows 4 --greedy-prompts 8 --greedy-tokens 256 --no-reference \
      --fused-max-batch-heads 0 --output "$out/accuracy-deferred-$gpu.json" \
      --doc "$out/accuracy.md" ;;
    e2e-int8-8b | e2e-int8-9b)
      model=$(shape_of "$s")
      e2e=(python3 benchmarks/e2e.py --models "$model" --batches 1,32,128,256 --repeats 3
        --output "$out/e2e-int8-$gpu.json")
      step "$s-builtin" "${e2e[@]}" --state-dtypes float32,bfloat16 --impls builtin
      step "$s-plugin" "${e2e[@]}" --state-dtypes int8 --impls plugin ;;
    host-layout)
      for sdt in float32 float32-ngram3; do
        step "host-layout-$sdt" python3 benchmarks/step_profile.py --model layout-8b \
          --state-dtype "$sdt" --batches 1 --host --output-dir "$out"
      done ;;
    e2e-ngram-8b)
      step e2e-ngram-8b python3 benchmarks/e2e.py --models nemotron-h-8b \
        --state-dtypes float32-ngram3 --batches 1,32 --repeats 3 --rounds 2 \
        --output "$out/e2e-8b-fp32-ngram3-$gpu.json"
      step profile-ngram-8b python3 benchmarks/step_profile.py --model nemotron-h-8b \
        --state-dtype float32-ngram3 --batches 1 --host --output-dir "$out" ;;
    pairs-ngram-8b)
      step pairs-ngram-8b python3 benchmarks/e2e.py --models nemotron-h-8b \
        --state-dtypes float32-ngram3 --batches 1,32 --pairs "${PAIRS:-10}" \
        --output "$out/e2e-8b-fp32-ngram3-pairs-$gpu.json" ;;
    pairs-9b)
      step pairs-9b python3 benchmarks/e2e.py --models nano-9b-v2 \
        --state-dtypes bfloat16 --batches 1,128 --pairs "${PAIRS:-10}" \
        --output "$out/e2e-9b-bf16-pairs-$gpu.json" ;;
    steps-ngram-8b)
      for b in 1 32; do
        step "rank-times-ngram-8b-b$b" python3 benchmarks/rank_step_times.py \
          --model nemotron-h-8b --state-dtype float32-ngram3 --batch "$b" \
          --tensor-parallel-size 1 --rounds 1 --decode-steps 96 --output-dir "$out"
      done ;;
    steps-ttft-8b|steps-ttft-9b)
      model=$(shape_of "$s")
      step "$s" python3 benchmarks/rank_step_times.py --model "$model" \
        --state-dtype bfloat16 --batch 1 --tensor-parallel-size 1 --rounds 3 \
        --decode-steps 8 --output-dir "$out" ;;
    ttft-8b|ttft-9b)
      model=$(shape_of "$s")
      step "$s" python3 benchmarks/e2e.py --models "$model" --state-dtypes bfloat16 \
        --batches 1,32,128 --repeats 3 --rounds 3 --output "$out/e2e-${s#ttft-}-bf16-ttft-rounds3-$gpu.json" ;;
    paired-8b|paired-9b)
      model=$(shape_of "$s")
      step "$s" "${paired[@]}" --models "$model" --state-dtype bfloat16 \
        --batches 1,32,128 --output "$out/paired-engines-$gpu.json" ;;
    paired-reversed-8b|paired-reversed-9b)
      model=$(shape_of "$s")
      step "$s" "${paired[@]}" --models "$model" --state-dtype bfloat16 \
        --batches 1,32,128 --pair plugin,builtin --output "$out/paired-engines-$gpu.json" ;;
    paired-control-8b|paired-control-9b)
      model=$(shape_of "$s")
      for pair in builtin,builtin plugin,plugin; do
        step "$s-${pair%%,*}" "${paired[@]}" --models "$model" \
          --state-dtype bfloat16 --batches 1,32,128 --decode-pairs 2 --pair "$pair" \
          --output "$out/paired-engines-$gpu.json"
      done ;;
    paired-profile-8b|paired-profile-9b)
      model=$(shape_of "$s")
      step "$s" "${paired[@]}" --models "$model" --state-dtype bfloat16 \
        --batches "${PAIRED_BATCHES:-1}" --engine-batches 1,32,128 --ttft-pairs 6 \
        --pair "${PAIR:-builtin,plugin}" --decode-pairs 1 --profile \
        --output "$out/paired-engines-profile-$gpu.json" ;;
    host-phases-8b|host-phases-9b|host-phases-reversed-8b|host-phases-reversed-9b)
      model=$(shape_of "$s")
      pair=builtin,plugin
      case $s in *-reversed-*) pair=plugin,builtin ;; esac
      step "$s" "${paired[@]}" --models "$model" --state-dtype bfloat16 \
        --batches "${PAIRED_BATCHES:-1}" --engine-batches 1,32,128 --decode-pairs 1 \
        --pair "$pair" --host-phases --output "$out/paired-engines-host-phases-$gpu.json" ;;
    host-samples-8b|host-samples-9b)
      model=$(shape_of "$s")
      step "$s" "${paired[@]}" --models "$model" --state-dtype bfloat16 \
        --batches 1 --engine-batches 1,32,128 --decode-pairs 2 --host-samples \
        --py-spy /root/py-spy \
        --output "$out/paired-engines-host-samples-$gpu.json" ;;
    deferred-choice)
      step deferred-engine-tests python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests/gpu/test_engine_gpu.py -k deferred
      step deferred-choice-e2e python3 benchmarks/e2e.py --models nemotron-h-8b \
        --state-dtypes int8,int8-deferred16 --impls plugin --batches 32,128 --repeats 3 \
        --output "$out/e2e-8b-int8-deferred-choice-$gpu.json" ;;
    scan-host)
      step scan-host python3 benchmarks/prefill_scan_host_time.py \
        --output "$out/prefill-scan-host-time-$gpu.json"
      boundary_tests
      step scan-engine-tests python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests/gpu/test_engine_gpu.py -k "fp32_eager or prefix_caching_mode_all" ;;
    scan-tuning)
      boundary_tests
      step scan-tuning python3 benchmarks/prefill_scan_tuning.py \
        --output "$out/prefill-scan-tuning-$gpu.json" ;;
    scan-tuning-start)
      step scan-tuning-start python3 benchmarks/scan_tuning_start.py --models nano-9b-v2 \
        --output "$out/scan-tuning-start-$gpu.json"
      step scan-tuning-start-warm-triton python3 benchmarks/scan_tuning_start.py \
        --models nano-9b-v2 --starts 2 --warm-triton \
        --output "$out/scan-tuning-start-warm-triton-$gpu.json" ;;
    prefix-caching-tests) step prefix-caching-tests python3 -m pytest -m gpu -s \
      -p no:cacheprovider tests/gpu/test_engine_gpu.py -k prefix_caching ;;
    model-drafts-tests) step model-drafts-tests python3 -m pytest -m gpu -s \
      -p no:cacheprovider tests/gpu/test_engine_gpu.py -k model_drafts ;;
    ngram-tests) step ngram-tests python3 -m pytest -m gpu -s \
      -p no:cacheprovider tests/gpu/test_engine_gpu.py -k ngram ;;
    boundary-tests) boundary_tests ;;
    serving-tests)
      step serving-tests env VLLM_NEMOTRON_H_REPORT_DIR="$out/reliability" python3 -m pytest -q \
        -p no:cacheprovider tests/test_reliability.py tests/test_serve.py -k "not vllm_defaults"
      serve_defaults ;;
    serve-defaults) serve_defaults ;;
    preemption-tests)
      for f32 in ${PREEMPTION_F32:-tf32 ieee}; do
        # a Triton cache of each precision's own: kernels compiled under the other not reused
        step "preemption-tests-$f32" env TRITON_F32_DEFAULT="$f32" TRITON_CACHE_DIR="/root/triton-$f32" \
          VLLM_NEMOTRON_H_REPORT_DIR="$out/reliability-$f32" \
          python3 -m pytest -q -p no:cacheprovider tests/test_reliability.py -k preemption
      done
      # the control: vLLM's own model through the same case (its prefill recomputes too)
      [ "${PREEMPTION_CONTROL:-1}" = 0 ] || step preemption-tests-builtin env \
        VLLM_NEMOTRON_H_DISABLE=1 TRITON_CACHE_DIR=/root/triton-tf32 \
        VLLM_NEMOTRON_H_REPORT_DIR="$out/reliability-builtin" \
        python3 -m pytest -q -p no:cacheprovider tests/test_reliability.py -k "preemption and per-step" ;;
    serve-load-8b) step serve-load-8b python3 benchmarks/serve_load.py --model nemotron-h-8b \
      --state-dtype float32 --vllm-bench --rounds "${ROUNDS:-1}" \
      --output "$out/serve-load-nemotron-h-8b-float32-$gpu.json" ;;
    int8-floor) step int8-floor python3 benchmarks/kernels/int8_state_floor.py \
      --models nemotron-h-8b,nano-9b-v2 --output "$out/kernels-int8_state_floor-$gpu.json" ;;
    deferred-floor) step deferred-floor python3 benchmarks/kernels/deferred_state_floor.py \
      --models nemotron-h-8b,nano-9b-v2 --output "$out/kernels-deferred_state_floor-$gpu.json" ;;
    *) echo "unknown step $s" >> "$out/progress" ;;
  esac
done
stop_clocks
echo "end $(date)" >> "$out/progress"
