"""Long-horizon drift of the decode state update, per SSM state format, at real shapes.

The plugin's ``selective_state_update`` (Triton on a GPU or under the Triton interpreter,
TRITON_INTERPRET=1; its CPU path otherwise) advances a batch of states for ``--steps`` decode
steps with the state stored in each format (int8: rows with an fp32 scale each), beside a
float64 recurrence on the same inputs. Inputs as a trained Mamba2 layer sees them:
A = -U(1, 16) (Mamba2's A init range), per-head step sizes log-uniform in [1e-3, 0.1] with
an eighth of the heads at 1e-3 (slow decay: a state that remembers ~1,000 steps), each step
jittered by exp(N(0, 0.3)) and kept inside [1e-3, 0.1]; x Student-t with 3 degrees of
freedom (heavy tails), B and C N(0, 1), D = 1, no gate.

Every ``--every`` steps: relative L2 error of the state and of y against float64, and the
state's signed bias, mean((s - s64) * sign(s64)) / mean(|s64|) (negative: the stored state
shrinks toward zero). Writes benchmarks/results/state-drift-<device>.json and .png.

With ``--ring L`` the state has deferred writes (ops/deferred_state_update): a checkpoint in
the format, written back from a ring of L tokens every L steps; the state is measured where
the ring has just been written back (``--every`` a multiple of L), y at every measured step.

    python benchmarks/state_drift.py                         # GPU: 8B and 9B shapes
    python benchmarks/state_drift.py --batch 1 --steps 512   # CPU (its CPU path)
    TRITON_INTERPRET=1 python benchmarks/state_drift.py --formats int8 --heads 8 --steps 512
                                          # CPU, the Triton kernel interpreted (8 of the heads)
    python benchmarks/state_drift.py --ring 16               # deferred writes, ring of 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vllm_nemotron_h.ops import selective_state_update  # noqa: E402
from vllm_nemotron_h.ops.deferred_state_update import deferred_state_update  # noqa: E402
from vllm_nemotron_h.ops.deferred_state_update.layout import with_empty_rings  # noqa: E402
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep  # noqa: E402
from vllm_nemotron_h.ops.state_format import dequantize  # noqa: E402
from vllm_nemotron_h.ops.support import use_triton  # noqa: E402

# Mamba shapes of the public models: (heads, head_dim, d_state, n_groups).
SHAPES = {"nemotron-h-8b": (128, 64, 128, 8), "nano-9b-v2": (128, 80, 128, 8)}
FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8}
DT_MIN, DT_MAX = 1e-3, 0.1


def inputs(
    heads: int,
    head_dim: int,
    d_state: int,
    groups: int,
    batch: int,
    steps: int,
    seed: int,
    device: str,
):
    """Per-step (x, dt, B, C) and the layer's (A, D, dt_bias), float64 on ``device``."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the Student-t draw uses the global generator
    A = -torch.empty(heads, dtype=torch.float64).uniform_(1, 16, generator=g)
    centers = torch.exp(
        torch.empty(heads, dtype=torch.float64).uniform_(
            torch.log(torch.tensor(DT_MIN)).item(),
            torch.log(torch.tensor(DT_MAX)).item(),
            generator=g,
        )
    )
    centers[: heads // 8] = DT_MIN
    dt = centers * torch.exp(
        0.3 * torch.randn(steps, batch, heads, generator=g, dtype=torch.float64)
    )
    dt = dt.clamp(DT_MIN, DT_MAX)
    dt_raw = torch.log(torch.expm1(dt))  # softplus^-1, dt_bias = 0
    x = torch.distributions.StudentT(3.0).sample((steps, batch, heads, head_dim)).double()
    B = torch.randn(steps, batch, groups, d_state, generator=g, dtype=torch.float64)
    C = torch.randn(steps, batch, groups, d_state, generator=g, dtype=torch.float64)
    layer = dict(
        A=A,
        D=torch.ones(heads, dtype=torch.float64),
        dt_bias=torch.zeros(heads, dtype=torch.float64),
    )
    return (
        {k: v.to(device) for k, v in dict(x=x, dt=dt_raw, B=B, C=C).items()},
        {k: v.to(device) for k, v in layer.items()},
    )


def drift(
    shape: str,
    fmt: str,
    batch: int,
    steps: int,
    every: int,
    device: str,
    seed: int,
    heads: int,
    ring: int = 0,
) -> dict:
    """``heads`` of the shape's heads (its heads per group kept; 0: all of them); ``ring``:
    deferred writes with a ring of that many tokens (0: the state written every token)."""
    all_heads, head_dim, d_state, groups = SHAPES[shape]
    per_group = all_heads // groups
    heads = heads or all_heads
    groups = max(1, heads // per_group)
    per_group = heads // groups
    seq, layer = inputs(heads, head_dim, d_state, groups, batch, steps, seed, device)
    state = torch.zeros(batch, heads, head_dim, d_state, dtype=FORMATS[fmt], device=device)
    scale = None
    if fmt == "int8":
        scale = torch.zeros(batch, heads, head_dim, dtype=torch.float32, device=device)
    ref = torch.zeros(batch, heads, head_dim, d_state, dtype=torch.float64, device=device)
    A32, D32, bias32 = (layer[k].float() for k in ("A", "D", "dt_bias"))
    # activations in fp32, as this script passes them
    rings = with_empty_rings(state, scale, groups, ring, torch.float32) if ring else None
    first_measured = ring or 1  # with a ring: its first write-back
    curve = []
    for t in range(steps):
        x, dt, B, C = (seq[k][t] for k in ("x", "dt", "B", "C"))
        if rings is None:
            y = selective_state_update(
                state, x.float(), dt.float(), A32, B.float(), C.float(), D32, bias32,
                state_scale=scale,
            )  # fmt: skip
        else:
            update = StateUpdateStep(x.float(), dt.float(), A32, B.float(), C.float(), D32, bias32)
            y = deferred_state_update(rings, update)
        dt_f = torch.nn.functional.softplus(dt + layer["dt_bias"])
        Bh = B.repeat_interleave(per_group, dim=1)
        Ch = C.repeat_interleave(per_group, dim=1)
        ref.mul_(torch.exp(layer["A"] * dt_f)[..., None, None]).add_(
            (dt_f[..., None] * x)[..., None] * Bh[:, :, None, :]
        )
        if (t + 1) % every == 0 or t + 1 == first_measured:
            y_ref = (ref * Ch[:, :, None, :]).sum(-1) + layer["D"][:, None] * x
            stored = state.double() if scale is None else dequantize(state, scale.double())
            err = stored - ref
            curve.append(
                dict(
                    step=t + 1,
                    state_rel_err=(err.norm() / ref.norm()).item(),
                    y_rel_err=((y.double() - y_ref).norm() / y_ref.norm()).item(),
                    state_bias=((err * ref.sign()).mean() / ref.abs().mean()).item(),
                )
            )
    return dict(shape=shape, format=fmt, ring=ring, curve=curve)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--every", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0, help="of each shape's heads (0: all)")
    ap.add_argument("--ring", type=int, default=0, help="deferred writes, a ring of this many")
    ap.add_argument("--output", type=Path)
    args = ap.parse_args()
    if args.ring and args.every % args.ring:
        ap.error(f"--every must be a multiple of --ring, got {args.every} and {args.ring}")
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    name = torch.cuda.get_device_name() if gpu else "cpu"
    tag = ("h100" if "H100" in name else name.split()[-1].lower()) if gpu else "cpu"
    rows = []
    for shape in args.shapes.split(","):
        for fmt in args.formats.split(","):
            t0 = time.perf_counter()
            row = drift(
                shape, fmt, args.batch, args.steps, args.every, device, args.seed, args.heads,
                args.ring,
            )  # fmt: skip
            last = row["curve"][-1]
            print(
                f"{shape} {fmt}: after {last['step']} steps state err {last['state_rel_err']:.2e}, "
                f"y err {last['y_rel_err']:.2e}, bias {last['state_bias']:+.2e} "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
            rows.append(row)
    doc = dict(
        meta=dict(
            device=name,
            torch=torch.__version__,
            date=time.strftime("%Y-%m-%d"),
            batch=args.batch,
            steps=args.steps,
            seed=args.seed,
            heads=args.heads or "all",
            ring=args.ring,
            kernel="triton" if use_triton(torch.empty(0, device=device)) else "CPU path",
        ),
        rows=rows,
    )
    out = args.output or ROOT / "benchmarks" / "results" / f"state-drift-{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    plot(doc, out.with_suffix(".png"))


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({r["shape"] for r in doc["rows"]})
    fig, axes = plt.subplots(2, len(shapes), figsize=(6 * len(shapes), 6.5), squeeze=False)
    for col, shape in enumerate(shapes):
        for r in (r for r in doc["rows"] if r["shape"] == shape):
            steps = [p["step"] for p in r["curve"]]
            color = f"C{list(FORMATS).index(r['format'])}"
            axes[0][col].plot(
                steps,
                [p["state_rel_err"] for p in r["curve"]],
                c=color,
                label=f"{r['format']} state",
            )
            axes[0][col].plot(
                steps,
                [p["y_rel_err"] for p in r["curve"]],
                c=color,
                ls="--",
                label=f"{r['format']} y",
            )
            axes[1][col].plot(
                steps, [p["state_bias"] for p in r["curve"]], c=color, label=r["format"]
            )
        axes[0][col].set_yscale("log")
        axes[0][col].set_title(f"{shape}: relative error vs float64", fontsize=9)
        axes[1][col].set_title(f"{shape}: signed bias of the state", fontsize=9)
        axes[1][col].set_xlabel("decode step")
        for ax in axes[:, col]:
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    m = doc["meta"]
    fig.suptitle(f"{m['device']} ({m['kernel']}), batch {m['batch']}, {m['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
