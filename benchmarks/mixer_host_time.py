"""Host time of the plugin's Mamba mixer per engine step: the Python, argument handling and
kernel launches of ``PluginMambaMixer2.conv_ssm_forward`` (all of a layer's per-step work
after the input projection), timed with ``time.perf_counter`` around each call and summed
per step over the model's Mamba layers. Steps are split into decode-only and mixed
(prefill rows beside decode rows). On a GPU the kernels run asynchronously and the engine is
eager, so what is timed is host time; on CPU it includes the compute.

The workload makes mixed steps: --requests prompts of --prompt-len tokens arrive together and
chunked prefill (--max-batched-tokens per step) interleaves their prefill chunks with the
decode rows of the others.

    python benchmarks/mixer_host_time.py --model dense --output F.json       # CPU or GPU
    python benchmarks/mixer_host_time.py --model nemotron-h-8b --output F.json  # GPU only

The script only touches the mixer's class path and the checkpoint writers, so it runs
unchanged against an older tree of the package (PYTHONPATH=OLD_TREE) for a before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine (and the mixer) in-process


def checkpoint(model: str, work: Path) -> dict:
    """Engine arguments of a tiny preset (its random checkpoint) or a real shape (dummy)."""
    try:
        from vllm_nemotron_h.testing import checkpoints
    except ImportError:  # a tree from before the testing package
        from vllm_nemotron_h import checkpoints
    if model in checkpoints.REAL_SHAPES:
        path = checkpoints.write_real_shape_config(work / model, model)
        return dict(model=str(path), load_format="dummy")
    return dict(model=str(checkpoints.write_tiny_checkpoint(work / model, model)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dense")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--max-batched-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()

    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.forward_context import get_forward_context

    import vllm_nemotron_h
    from vllm_nemotron_h.model_executor.mamba2_mixer import PluginMambaMixer2

    gpu = torch.cuda.is_available()
    steps: dict[int, list[float]] = {}  # id of the step's forward context -> per-layer times
    kinds: dict[int, str] = {}
    timed = PluginMambaMixer2.conv_ssm_forward

    def conv_ssm_forward(self, projected_states, output):
        t0 = time.perf_counter()
        timed(self, projected_states, output)
        dt = time.perf_counter() - t0
        ctx = get_forward_context()
        md = ctx.attn_metadata[self.prefix] if isinstance(ctx.attn_metadata, dict) else None
        if md is None:
            return  # the profile run
        key = id(ctx)
        steps.setdefault(key, []).append(dt)
        kinds[key] = (
            "mixed"
            if md.num_prefills and md.num_decodes
            else ("prefill" if md.num_prefills else "decode")
        )

    PluginMambaMixer2.conv_ssm_forward = conv_ssm_forward
    engine = dict(
        max_model_len=args.prompt_len + args.new_tokens + 16,
        max_num_seqs=args.requests,
        max_num_batched_tokens=args.max_batched_tokens,
        enable_chunked_prefill=True,
        enforce_eager=True,
        enable_prefix_caching=False,
    )
    engine.update(
        dict(dtype="bfloat16", gpu_memory_utilization=0.5)
        if gpu
        else dict(dtype="float32", gpu_memory_utilization=0.1)
    )
    llm = LLM(**checkpoint(args.model, Path(tempfile.mkdtemp())), **engine)
    gen = torch.Generator().manual_seed(0)
    vocab = llm.get_tokenizer().vocab_size
    prompts = [
        {"prompt_token_ids": torch.randint(10, vocab, (args.prompt_len,), generator=gen).tolist()}
        for _ in range(args.requests)
    ]
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True, temperature=0)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: plans made, kernels compiled
    steps.clear()
    kinds.clear()
    for _ in range(args.repeats):
        llm.generate(prompts, params, use_tqdm=False)
    per_step = {k: sum(v) for k, v in steps.items()}
    layers = statistics.mode(len(v) for v in steps.values())
    rows = {}
    for kind in ("decode", "mixed", "prefill"):
        times = [per_step[k] * 1e6 for k in per_step if kinds[k] == kind]
        if times:
            rows[kind] = dict(
                steps=len(times),
                median_us_per_step=round(statistics.median(times), 1),
                median_us_per_layer=round(statistics.median(times) / layers, 2),
            )
            print(
                f"{kind:8s} {len(times):4d} steps  median {rows[kind]['median_us_per_step']:9.1f}"
                f" us per step ({layers} Mamba layers, {rows[kind]['median_us_per_layer']:.2f}"
                " us per layer)",
                flush=True,
            )
    meta = dict(
        package=str(Path(vllm_nemotron_h.__file__).parent),
        device=torch.cuda.get_device_name() if gpu else "cpu",
        vllm=vllm.__version__,
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d"),
        **{k: v for k, v in vars(args).items() if k != "output"},
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str))
    print("wrote", args.output)


if __name__ == "__main__":
    main()
