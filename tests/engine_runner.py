"""Runs one vLLM engine in a fresh process and prints one JSON line with what it generated.

The tests start engines through this script when they need a process of their own (vLLM's
built-in model with VLLM_NEMOTRON_H_DISABLE=1, GPU runs, tensor parallel):

    python tests/engine_runner.py '{"model": "...", "prompts": [[1, 2, 3]], "max_tokens": 8,
                                    "engine": {"dtype": "float32"}, "logprobs": false,
                                    "jobs": [[[1, 2]], [[3, 4], [5]]], "metrics": true}'

``prompts`` run as one batch (result "tokens"; ``max_tokens`` may be one per prompt); each
entry of ``jobs`` runs afterwards as a batch of its own through the same engine (result
"jobs"); "cached_tokens" holds each request's prompt tokens served from the prefix cache,
per batch (the first, then each job's). With "metrics" (and ``disable_log_stats: false``
among the engine arguments) the engine's counters and gauges after all of it come back as
"metrics" (e.g. "vllm:num_preemptions"). With "logprobs" the first batch's chosen tokens'
logprobs come back as "logprobs", and per token of every request (the first batch, then each
job's) how far the chosen token led the best other one, in nats, as "margins" (near 0 at a
near-tie, which another batch's rounding may turn over).
With "compiles" the Triton kernels compiled after the engine started (in its requests, not
its warm-up) come back as "compiled_in_requests" (the engine in this process).
"launch_tables" replaces entries of the plugin's launch tables (ops/launch_config.py) while the
engine runs; it reaches the model only with the engine in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys


def run(spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_nemotron_h.testing import model_class_name

    llm = LLM(model=spec["model"], **spec.get("engine", {}))
    max_tokens = spec.get("max_tokens", 16)
    # One max_tokens per prompt of the first batch where a list is given (sequences that end
    # early, so that later prompts join steps in which others decode).
    counts = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(spec["prompts"])

    def sampling(n: int) -> SamplingParams:
        return SamplingParams(
            temperature=0.0,
            max_tokens=n,
            ignore_eos=True,
            logprobs=2 if spec.get("logprobs") else None,  # the runner-up too: margins
        )

    params = sampling(max(counts))
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    result: dict = {"model_class": llm.apply_model(model_class_name)[0]}
    if spec.get("compiles"):
        result["compiled_in_requests"] = compiles_from_now()
    if spec.get("profile"):
        result["profile"] = profile_decode(llm, prompts[0], params)
    outs = llm.generate(prompts, [sampling(n) for n in counts], use_tqdm=False)
    result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
    # prompt tokens served from the prefix cache, per request (the first batch, then jobs)
    result["cached_tokens"] = [[o.num_cached_tokens or 0 for o in outs]]
    if spec.get("text_prompts"):
        outs = llm.generate(spec["text_prompts"], params, use_tqdm=False)
        result["texts"] = [o.outputs[0].text for o in outs]
    # Further batches through the same engine (batch invariance, slot reuse).
    result["jobs"] = []
    margins = [margins_of(o) for o in outs] if spec.get("logprobs") else None
    for job in spec.get("jobs", []):
        job_outs = llm.generate([{"prompt_token_ids": p} for p in job], params, use_tqdm=False)
        result["jobs"].append([list(o.outputs[0].token_ids) for o in job_outs])
        result["cached_tokens"].append([o.num_cached_tokens or 0 for o in job_outs])
        if margins is not None:
            margins += [margins_of(o) for o in job_outs]
    if spec.get("logprobs"):
        result["logprobs"] = [
            [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
            for o in outs
        ]
        result["margins"] = margins
    if spec.get("metrics"):
        result["metrics"] = {
            m.name: m.value
            for m in llm.get_metrics()
            if isinstance(getattr(m, "value", None), (int, float))
        }
    return result


def compiles_from_now() -> list[str]:
    """The Triton kernels (``module.function``) compiled in this process from now on, in
    the order they compile (the engine must run in this process:
    VLLM_ENABLE_V1_MULTIPROCESSING=0); a hook already installed still runs."""
    import triton

    compiled: list[str] = []
    previous = triton.knobs.runtime.jit_post_compile_hook

    def record(**info):
        compiled.append(f"{info['fn'].module}.{info['fn'].name}")
        return previous(**info) if previous is not None else None

    triton.knobs.runtime.jit_post_compile_hook = record
    return compiled


def margins_of(output) -> list[float]:
    """Per generated token: its logprob less the best other candidate's (logprobs=2)."""
    completion = output.outputs[0]
    return [
        lead_over_runner_up(t, {k: v.logprob for k, v in lp.items()})
        for t, lp in zip(completion.token_ids, completion.logprobs)
    ]


def lead_over_runner_up(chosen, logprobs: dict) -> float:
    """How far the ``chosen`` candidate's logprob lies above the best other's in
    ``logprobs`` (candidate -> logprob), in nats; inf where it is the only one."""
    others = [v for k, v in logprobs.items() if k != chosen]
    return logprobs[chosen] - max(others, default=float("-inf"))


def profile_decode(llm, prompt, params) -> list[list]:
    """CUDA kernels of a few decode steps, by total time (engine must run in this process:
    VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import SamplingParams

    llm.generate([prompt], SamplingParams(max_tokens=2), use_tqdm=False)  # warm
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(
            [prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False
        )
        torch.cuda.synchronize()
    rows = [
        (e.key, e.count, round(e.device_time_total, 1))
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    return sorted(rows, key=lambda r: -r[2])[:40]


def run_with_tables(spec: dict) -> dict:
    from vllm_nemotron_h.ops.launch_config import overridden

    with contextlib.ExitStack() as tables:
        for name, value in spec.get("launch_tables", {}).items():
            tables.enter_context(overridden(name, value))
        return run(spec)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    print("ENGINE_RESULT " + json.dumps(run_with_tables(json.loads(sys.argv[1]))), flush=True)
