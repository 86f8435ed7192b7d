"""Trains the shipped model: a small Nemotron-H on Python's standard library source.

transformers' ``NemotronHForCausalLM`` (its PyTorch scan and conv; no mamba_ssm needed), bf16
autocast, AdamW, linear warm-up then cosine decay, fixed seed. Runs on one GPU inside a
10-minute call (H100: see the model card for the time it took):

    python -m training.pycode_data .cache/pycode-data          # CPU: data and tokenizer
    python -m training.train_pycode .cache/pycode-data OUT     # GPU: weights, loss log, plot

OUT receives ``model.safetensors`` (bf16), ``train_log.json`` (the loss curve and the run's
settings) and ``loss.png``. ``config.json`` is written by ``training/ship_model.py`` from
:func:`pycode_config`, so that the shipped file does not depend on the trainer's version of
transformers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from training.pycode_data import VOCAB_SIZE
from vllm_nemotron_h.testing.checkpoints import preset

# All four layer kinds (Mamba2 M, attention *, MLP -, MoE E); Mamba head_dim 64, d_state 64,
# 2 groups; the fields every project checkpoint shares come from checkpoints.make_config.
# 14.2 M parameters (28.4 MB in bf16).
PYCODE_PRESET: dict = preset(
    ("M-M*MEM-", 384, 12, 64, 64, 2, 6, 2, 64, 1024), (8, 2, 256, 512, 1.0)
)


def pycode_config(dtype: str = "bfloat16"):
    """The shipped model's transformers ``NemotronHConfig``."""
    from vllm_nemotron_h.testing.checkpoints import make_config

    return make_config(PYCODE_PRESET, VOCAB_SIZE, dtype)


TRAINING = dict(
    seed=0,
    seq_len=2048,
    batch=8,
    steps=1000,
    warmup=100,
    lr=2e-3,
    min_lr_ratio=0.1,
    weight_decay=0.1,
    betas=(0.9, 0.95),
    grad_clip=1.0,
    eval_every=100,
    eval_windows=32,
    log_every=10,
)


def lr_at(step: int, t: dict) -> float:
    if step < t["warmup"]:
        return t["lr"] * (step + 1) / t["warmup"]
    progress = (step - t["warmup"]) / max(1, t["steps"] - t["warmup"])
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return t["lr"] * (t["min_lr_ratio"] + (1 - t["min_lr_ratio"]) * cosine)


def unclamp_dt(model) -> None:
    """transformers clamps softplus(dt + dt_bias) from below at config.time_step_min; vLLM
    (and so the served model) does not. Train the function that is served."""
    for module in model.modules():
        if hasattr(module, "time_step_limit"):
            module.time_step_limit = (0.0, float("inf"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path, help="folder written by training/pycode_data.py")
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=TRAINING["steps"])
    ap.add_argument(
        "--time-budget",
        type=float,
        default=480.0,
        help="seconds for the training loop; if the first steps show that --steps would not "
        "fit, the step count (and so the schedule) is cut once, at step 25, and logged",
    )
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import numpy as np
    import torch
    from transformers import NemotronHForCausalLM

    t = dict(TRAINING, steps=args.steps)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(t["seed"])
    config = pycode_config()
    model = NemotronHForCausalLM(config).to(device)
    unclamp_dt(model)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params}", flush=True)

    train = torch.from_numpy(np.fromfile(args.data / "train.bin", dtype=np.uint16).astype(np.int64))
    held = torch.from_numpy(
        np.fromfile(args.data / "heldout.bin", dtype=np.uint16).astype(np.int64)
    )
    train, held = train.to(device), held.to(device)
    L = t["seq_len"]
    gen = torch.Generator(device="cpu").manual_seed(t["seed"])
    n_eval = min(t["eval_windows"], (len(held) - 1) // L)
    eval_starts = torch.linspace(0, len(held) - L - 1, n_eval).long().tolist()

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": t["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=t["lr"],
        betas=t["betas"],
        fused=device == "cuda",
    )
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

    def evaluate() -> float:
        model.eval()
        total = 0.0
        with torch.no_grad(), autocast:
            for s in eval_starts:
                x = held[s : s + L + 1].unsqueeze(0)
                logits = model(input_ids=x[:, :-1]).logits.float()
                total += torch.nn.functional.cross_entropy(logits[0], x[0, 1:]).item()
        model.train()
        return total / len(eval_starts)

    log = dict(
        config=PYCODE_PRESET,
        training=t,
        parameters=n_params,
        device=str(torch.cuda.get_device_name() if device == "cuda" else "cpu"),
        torch=torch.__version__,
        transformers=__import__("transformers").__version__,
        train=[],
        heldout=[],
    )
    model.train()
    start = time.perf_counter()
    step, eval_seconds, first_eval = 0, 0.0, 0.0
    mark, evals_at_mark = start, 0.0
    while step < t["steps"]:
        if step == 5:
            mark, evals_at_mark = time.perf_counter(), eval_seconds
        if step == 25:  # warm: time 20 steps, then fit the rest (and its evaluations) in
            now = time.perf_counter()
            per_step = (now - mark - (eval_seconds - evals_at_mark)) / 20
            left = args.time_budget - (now - start)
            fits = 25 + max(0, int(left / (per_step + first_eval / t["eval_every"])))
            if fits < t["steps"]:
                print(f"steps cut from {t['steps']} to {fits} to fit the time budget", flush=True)
                log["steps_cut_from"] = t["steps"]
                t["steps"] = fits
        if step % t["eval_every"] == 0:
            began = time.perf_counter()
            log["heldout"].append([step, evaluate()])
            eval_seconds += time.perf_counter() - began
            first_eval = first_eval or eval_seconds
            print(f"step {step} heldout loss {log['heldout'][-1][1]:.4f}", flush=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t)
        starts = torch.randint(0, len(train) - L - 1, (t["batch"],), generator=gen)
        x = torch.stack([train[s : s + L + 1] for s in starts.tolist()])
        with autocast:
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        step += 1
        if step % t["log_every"] == 0:
            elapsed = time.perf_counter() - start
            log["train"].append([step, loss.item(), elapsed])
            print(
                f"step {step} loss {loss.item():.4f} lr {lr_at(step - 1, t):.2e} "
                f"{step * t['batch'] * L / elapsed:.0f} tok/s {elapsed:.0f} s",
                flush=True,
            )
    log["heldout"].append([step, evaluate()])
    log["train_seconds"] = time.perf_counter() - start
    log["tokens_seen"] = step * t["batch"] * L
    final = log["heldout"][-1][1]
    print(f"done: {step} steps, {log['train_seconds']:.0f} s, heldout loss {final:.4f}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    # save_pretrained writes the checkpoint layout (backbone.*, one tensor per expert) that
    # vLLM loads; the module's own state_dict holds the experts fused.
    with tempfile.TemporaryDirectory() as tmp:
        model.to(torch.bfloat16).save_pretrained(tmp)
        shutil.move(Path(tmp) / "model.safetensors", args.out / "model.safetensors")
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1))
    plot_loss(log, args.out / "loss.png")


def plot_loss(log: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps, losses = zip(*[(s, v) for s, v, _ in log["train"]])
    ax.plot(steps, losses, label="training batch loss", lw=1)
    h_steps, h_losses = zip(*log["heldout"])
    ax.plot(h_steps, h_losses, "o-", label="held-out loss (files never trained on)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(0, max(min(losses[0], 9.5), max(h_losses[1:] or h_losses)) + 0.2)
    ax.set_title(f"Nemotron-H pycode, {log['parameters'] / 1e6:.1f} M parameters, {log['device']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
