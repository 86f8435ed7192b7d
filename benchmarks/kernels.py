"""Decode-kernel benchmark on a GPU: the project's kernels against vLLM's on identical inputs.

Times CUDA-graph replays (median) of L launches over L rotating input sets (together larger
than L2), counts the bytes each kernel must move and reports the fraction of the measured
copy roofline, and how long a plain device copy of the same bytes takes in the same harness
(what any streaming kernel of that size can reach: launch and ramp included). Writes
benchmarks/results/kernels-<gpu>.json (+ .png) and, with --tune, the
launch-config sweep of the state update, the conv update and the fused decode tail
(kernel-tuning-<gpu>.json, or a file of --tune-out) instead of the comparison.

    python benchmarks/kernels.py [--models M,..] [--tune [KERNEL,..] [--quick]]
    python benchmarks/kernels.py --compare selective_state_update --batches 1,128 --output F
    python benchmarks/kernels.py --tables benchmarks/results/kernel-tuning-h100.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import platform
import time
from pathlib import Path

import torch
import triton

from vllm_nemotron_h.ops import (
    DecodeWorkspace,
    causal_conv1d_update,
    gather_state_slots,
    group_rms_norm,
    launch_config,
    mamba2_decode,
    scatter_state_slots,
    selective_state_update,
)
from vllm_nemotron_h.testing.checkpoints import REAL_SHAPES

RESULTS = Path(__file__).parent / "results"
BATCHES = (1, 8, 32, 64, 128, 256)
ROTATE_BYTES = 512 << 20


def copy_roofline() -> float:
    """Bytes/s of a 1 GiB device copy, read + write counted."""
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3)


def time_rotating(make_call, bytes_per_call: int) -> float:
    """Microseconds per call: a CUDA graph of L calls, each on its own input set."""
    sets = max(2, min(64, math.ceil(ROTATE_BYTES / max(bytes_per_call, 1))))
    calls = [make_call() for _ in range(sets)]
    # do_bench_cudagraph runs the calls on a stream of its own, which does not wait for the
    # default stream that made the inputs: without this sync the first call could read slot
    # indices not yet written (the "illegal memory access" of earlier runs, in vLLM's kernel).
    torch.cuda.synchronize()

    def run():
        for c in calls:
            c()

    ms = triton.testing.do_bench_cudagraph(run, rep=100, return_mode="median")
    calls.clear()  # free the input sets before the next measurement
    torch.cuda.empty_cache()
    return ms * 1e3 / sets


@functools.cache
def copy_us(nbytes: int) -> float:
    """Microseconds that moving ``nbytes`` (half read, half written) takes a plain device copy
    in the same harness: the faster of a memcpy (``Tensor.copy_``) and an elementwise kernel
    (``torch.neg``). What a streaming kernel of that size can reach, launch and ramp included."""
    n = max(8, nbytes // 4)  # bf16 elements per side

    def make(op):
        src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        return lambda: op(src, dst)

    return min(
        time_rotating(lambda: make(lambda a, b: b.copy_(a)), nbytes),
        time_rotating(lambda: make(lambda a, b: torch.neg(a, out=b)), nbytes),
    )


def shape_of(model: str) -> dict:
    s = REAL_SHAPES[model]
    heads, hd, n, g = s["mamba_num_heads"], s["mamba_head_dim"], s["ssm_state_size"], s["n_groups"]
    return dict(heads=heads, head_dim=hd, d_state=n, groups=g, conv_dim=heads * hd + 2 * g * n)


def ssu_inputs(sh: dict, batch: int, state_dtype, act=torch.bfloat16, gate: bool = True):
    H, P, N, G = sh["heads"], sh["head_dim"], sh["d_state"], sh["groups"]
    dev = "cuda"
    state = torch.randn(batch + 1, H, P, N, device=dev).to(state_dtype)
    slots = torch.randperm(batch, device=dev) + 1  # slot 0 is vLLM's null block
    return dict(
        state=state,
        x=torch.randn(batch, H, P, device=dev, dtype=act),
        dt=torch.randn(batch, H, device=dev, dtype=act),
        A=-torch.rand(H, device=dev) - 0.5,
        B=torch.randn(batch, G, N, device=dev, dtype=act),
        C=torch.randn(batch, G, N, device=dev, dtype=act),
        D=torch.randn(H, device=dev),
        dt_bias=torch.randn(H, device=dev) * 0.1,
        z=torch.randn(batch, H, P, device=dev, dtype=act) if gate else None,
        slots=slots,
        out=torch.empty(batch, H, P, device=dev, dtype=act),
    )


def ssu_bytes(sh: dict, batch: int, state_dtype, gate: bool, act_bytes: int = 2) -> int:
    H, P, N, G = sh["heads"], sh["head_dim"], sh["d_state"], sh["groups"]
    sb = state_dtype.itemsize
    return batch * (
        2 * H * P * N * sb
        + (3 if gate else 2) * H * P * act_bytes
        + 2 * G * N * act_bytes
        + H * act_bytes
    )


def ours_ssu(t, config=None):
    return lambda: selective_state_update(
        t["state"],
        t["x"],
        t["dt"],
        t["A"],
        t["B"],
        t["C"],
        t["D"],
        t["dt_bias"],
        z=t["z"],
        state_slots=t["slots"],
        null_slot=0,
        out=t["out"],
        config=config,
    )


def vllm_ssu(t, sh):
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update as v

    P, N = sh["head_dim"], sh["d_state"]
    A = t["A"][:, None, None].expand(-1, P, N)
    dt = t["dt"][:, :, None].expand(-1, -1, P)
    D, dtb = t["D"][:, None].expand(-1, P), t["dt_bias"][:, None].expand(-1, P)
    slots = t["slots"].to(torch.int32)
    return lambda: v(
        t["state"],
        t["x"],
        dt,
        A,
        t["B"],
        t["C"],
        D,
        dtb,
        z=t["z"],
        dt_softplus=True,
        state_batch_indices=slots,
        out=t["out"],
    )


def conv_inputs(sh: dict, batch: int, act=torch.bfloat16):
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    dim, dev = sh["conv_dim"], "cuda"
    if is_conv_state_dim_first():
        state = torch.randn(batch + 1, dim, 3, device=dev, dtype=act)
    else:
        state = torch.randn(batch + 1, 3, dim, device=dev, dtype=act).transpose(-1, -2)
    return dict(
        x=torch.randn(batch, dim, device=dev, dtype=act),
        state=state,
        w=torch.randn(dim, 4, device=dev, dtype=act),
        b=torch.randn(dim, device=dev, dtype=act),
        slots=torch.randperm(batch, device=dev) + 1,
        out=torch.empty(batch, dim, device=dev, dtype=act),
    )


def conv_bytes(sh: dict, batch: int) -> int:
    return batch * sh["conv_dim"] * (2 * 3 + 2) * 2 + sh["conv_dim"] * 5 * 2


def norm_bytes(sh: dict, batch: int, gate: bool) -> int:
    return batch * sh["heads"] * sh["head_dim"] * (3 if gate else 2) * 2


def vllm_conv(t):
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update as v

    slots = t["slots"].to(torch.int32)
    return lambda: v(t["x"], t["state"], t["w"], t["b"], "silu", conv_state_indices=slots)


def ours_conv(t, config=None):
    return lambda: causal_conv1d_update(
        t["x"],
        t["state"],
        t["w"],
        t["b"],
        "silu",
        state_slots=t["slots"],
        null_slot=0,
        out=t["out"],
        config=config,
    )


def norm_inputs(sh: dict, batch: int):
    inner, dev = sh["heads"] * sh["head_dim"], "cuda"
    return dict(
        x=torch.randn(batch, inner, device=dev, dtype=torch.bfloat16),
        z=torch.randn(batch, inner, device=dev, dtype=torch.bfloat16),
        w=torch.randn(inner, device=dev, dtype=torch.bfloat16),
    )


def vllm_gated_norm(t, sh):
    from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated

    gs = sh["heads"] * sh["head_dim"] // sh["groups"]
    return lambda: rms_norm_gated(
        t["x"], t["w"], None, z=t["z"], eps=1e-5, group_size=gs, norm_before_gate=False
    )


def ours_norm(t, sh, gate: bool):
    gs = sh["heads"] * sh["head_dim"] // sh["groups"]
    return lambda: group_rms_norm(t["x"], t["w"], gs, 1e-5, z=t["z"] if gate else None)


def fused_inputs(sh: dict, batch: int, state_dtype, act=torch.bfloat16):
    """The decode tail's inputs as the engine passes them: xbc, z and dt are strided views of
    one projection row; vLLM's conv-state layout."""
    H, P, N = sh["heads"], sh["head_dim"], sh["d_state"]
    inner, conv_dim, dev = H * P, sh["conv_dim"], "cuda"
    proj = torch.randn(batch, inner + conv_dim + H, device=dev, dtype=act)
    c = conv_inputs(sh, batch, act)
    return dict(
        xbc=proj[:, inner : inner + conv_dim],
        dt=proj[:, inner + conv_dim :],
        z=proj[:, :inner],
        conv_state=c["state"],
        conv_weight=c["w"],
        conv_bias=c["b"],
        ssm_state=torch.randn(batch + 1, H, P, N, device=dev).to(state_dtype),
        A=-torch.rand(H, device=dev) - 0.5,
        D=torch.randn(H, device=dev),
        dt_bias=torch.randn(H, device=dev) * 0.1,
        norm_weight=torch.randn(inner, device=dev, dtype=act),
        state_slots=c["slots"],
        out=torch.empty(batch, inner, device=dev, dtype=act),
        workspace=DecodeWorkspace.allocate(batch, H, P, dev),
    )


def fused_bytes(sh: dict, batch: int, state_dtype, act_bytes: int = 2) -> int:
    """What the fused tail must move: both states read and written, xbc, z, dt read, out
    written, the conv weights (intermediates stay on chip)."""
    H, P, N, D = sh["heads"], sh["head_dim"], sh["d_state"], sh["conv_dim"]
    return (
        batch
        * (
            2 * H * P * N * state_dtype.itemsize
            + D * (2 * 3 + 1) * act_bytes
            + 2 * H * P * act_bytes
            + H * act_bytes
        )
        + D * 5 * act_bytes
    )


def ours_fused(t, sh, norm: bool, config=None):
    """The fused kernel; without ``norm`` it leaves the group norm to its own kernel."""
    gs = sh["heads"] * sh["head_dim"] // sh["groups"]
    call = dict(t, norm_weight=t["norm_weight"] if norm else None, config=config, fuse=True)
    if norm:
        return lambda: mamba2_decode(**call, null_slot=0)
    return lambda: (
        mamba2_decode(**call, null_slot=0),
        group_rms_norm(t["out"], t["norm_weight"], gs, 1e-5, out=t["out"]),
    )


def slot_copy_inputs(sh: dict, batch: int, state_dtype) -> dict:
    """A prefill's final states and a state cache with spare slots; every row has an
    initial state (the gather's worst case)."""
    per_slot = (sh["heads"], sh["head_dim"], sh["d_state"])
    state = torch.randn(batch + 8, *per_slot, device="cuda").to(state_dtype)
    return dict(
        state=state,
        slots=torch.randperm(batch + 8, device="cuda")[:batch].to(torch.int32),
        values=torch.randn(batch, *per_slot, device="cuda").to(state_dtype),
        has_initial=torch.ones(batch, dtype=torch.bool, device="cuda"),
    )


def slot_copy_bytes(sh: dict, batch: int, state_dtype) -> int:
    return 2 * batch * sh["heads"] * sh["head_dim"] * sh["d_state"] * state_dtype.itemsize


def ours_scatter(t):
    return lambda: scatter_state_slots(t["state"], t["slots"], t["values"])


def ours_gather(t):
    return lambda: gather_state_slots(t["state"], t["slots"], t["has_initial"])


def vllm_scatter(t):
    # What vLLM's MambaMixer2 does with a prefill's final states (and the plugin did before).
    return lambda: t["state"].__setitem__(t["slots"], t["values"])


def vllm_gather(t):
    flags = t["has_initial"][:, None, None, None]
    return lambda: torch.where(flags, t["state"][t["slots"]], 0)


def best_config(label: str, configs, make_call, nbytes: int, rows: list, **key) -> None:
    """Times every config, appends one row per config and prints the winner."""
    timed = []
    for cfg in configs:
        us = time_rotating(lambda: make_call(cfg), nbytes)
        rows.append(dict(key, config=list(cfg), us=us))
        timed.append((us, cfg))
    us, cfg = min(timed)
    print(f"tune {label} best {cfg} {us:8.2f}us", flush=True)


TUNABLE = ("selective_state_update", "causal_conv1d_update", "mamba2_decode")
FUSED_TUNE_MAX = 32


_TABLE_OVERRIDES = contextlib.ExitStack()


def use_tables(path: Path) -> None:
    """Runs the comparison with the tables a --tune JSON gives instead of the device's file
    (to see a sweep's effect before writing it with --tables --write)."""
    for name, table in tuned_tables(json.loads(path.read_text())).items():
        _TABLE_OVERRIDES.enter_context(launch_config.overridden(name, table))
        print("using", name, table, flush=True)


def tune(
    models,
    quick: bool,
    kernels=TUNABLE,
    batches=BATCHES,
    state_dtypes=(torch.float32, torch.bfloat16),
) -> list:
    """Sweeps the launch configs of the state update and the fused decode tail (BLOCK_M,
    num_warps) and of the conv update (BLOCK_D, num_warps) per shape, state dtype and batch."""
    rows: list = []
    warps = (2, 4) if quick else (1, 2, 4)
    for model in models:
        sh = shape_of(model)
        group_rows = sh["heads"] // sh["groups"] * sh["head_dim"]
        tiles = [bm for bm in (4, 8, 16, 32, 64, 128) if group_rows % bm == 0]
        for kernel, sdt, batch in itertools.product(
            ("selective_state_update", "mamba2_decode"), state_dtypes, batches
        ):
            # The fused tail runs at small batches only (FUSED_MAX_BATCH_HEADS).
            if kernel not in kernels or (kernel == "mamba2_decode" and batch > FUSED_TUNE_MAX):
                continue
            cfgs = [(bm, w) for bm in tiles for w in warps if bm <= 64 or kernel == "mamba2_decode"]
            if kernel == "selective_state_update":
                call, nbytes = (
                    lambda cfg: ours_ssu(ssu_inputs(sh, batch, sdt), cfg),
                    ssu_bytes(sh, batch, sdt, True),
                )
            else:
                call, nbytes = (
                    lambda cfg: ours_fused(fused_inputs(sh, batch, sdt), sh, True, cfg),
                    fused_bytes(sh, batch, sdt),
                )
            best_config(
                f"{kernel:22s} {model:12s} {str(sdt)[6:]:9s} B={batch:4d}",
                cfgs,
                call,
                nbytes,
                rows,
                kernel=kernel,
                model=model,
                state_dtype=str(sdt)[6:],
                batch=batch,
            )
        if "causal_conv1d_update" not in kernels:
            continue
        conv_cfgs = [(bd, w) for bd in (128, 256, 512, 1024) for w in warps]
        for batch in batches:
            best_config(
                f"causal_conv1d_update   {model:12s} B={batch:4d}",
                conv_cfgs,
                lambda cfg: ours_conv(conv_inputs(sh, batch), cfg),
                conv_bytes(sh, batch),
                rows,
                kernel="causal_conv1d_update",
                model=model,
                batch=batch,
            )
    return rows


def tuned_tables(rows: list) -> dict:
    """The TUNED_CONFIGS tables of the swept kernels from a --tune sweep: at each measured point
    (batch x heads for the state update, batch x channels for the conv update) the config with
    the smallest mean time relative to the point's best (shapes that share a key and a point
    are averaged); a config applies up to its point, consecutive equal ones merged, the last
    one open-ended (None), laid out as the device files of vllm_nemotron_h/ops/configs."""
    points: dict = {}
    for r in rows:
        sh = shape_of(r["model"])
        if r["kernel"] in ("selective_state_update", "mamba2_decode"):
            state_bytes = 4 if r["state_dtype"] == "float32" else 2
            key = (r["kernel"], sh["head_dim"], sh["d_state"], state_bytes)
            point = r["batch"] * sh["heads"]
        else:
            key, point = "causal_conv1d_update", r["batch"] * sh["conv_dim"]
        cell = points.setdefault(key, {}).setdefault(point, {}).setdefault(r["model"], {})
        cell[tuple(r["config"])] = r["us"]
    tables = {}
    for key, by_point in points.items():
        table: list = []
        for point in sorted(by_point):
            runs = by_point[point].values()  # one {config: us} per shape measured here
            common = set.intersection(*(set(run) for run in runs))
            best = min(
                common, key=lambda c: sum(run[c] / min(run.values()) for run in runs) / len(runs)
            )
            if table and table[-1][1:] == best:
                table.pop()
            table.append((point, *best))
        rows_ = [list(row) for row in table]
        rows_[-1][0] = None
        if key == "causal_conv1d_update":
            tables[key] = rows_
        else:
            tables.setdefault(key[0], {})[",".join(map(str, key[1:]))] = rows_
    return tables


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--tune",
        nargs="?",
        const=",".join(TUNABLE),
        help=f"sweep launch configs only, of these kernels (default all: {','.join(TUNABLE)})",
    )
    ap.add_argument("--tune-out", type=Path, help="sweep JSON (default kernel-tuning-<gpu>)")
    ap.add_argument("--use-tables", type=Path, help="compare with the tables of this sweep JSON")
    ap.add_argument("--quick", action="store_true", help="tune with 2 and 4 warps only")
    ap.add_argument(
        "--tables", type=Path, help="print the launch tables of a --tune JSON and exit"
    )
    ap.add_argument("--write", metavar="DEVICE", help="with --tables: write DEVICE's file")
    ap.add_argument("--models", default=",".join(REAL_SHAPES))
    # A subset of the comparison (a re-check of a few points): write it with --output.
    ap.add_argument(
        "--compare", default="selective_state_update,conv_and_norm,decode_tail,state_slot_copy"
    )
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--state-dtypes", default="float32,bfloat16")
    ap.add_argument("--output", type=Path, help="comparison JSON (default kernels-<gpu>.json)")
    args = ap.parse_args()
    if args.tables:
        tables = tuned_tables(json.loads(args.tables.read_text()))
        print(json.dumps(tables, indent=1))
        if args.write:
            how = f"derived by benchmarks/kernels.py --tables from {args.tables}"
            print("wrote", launch_config.write_device_file(args.write, tables, how))
        return
    if args.use_tables:
        use_tables(args.use_tables)
    models = args.models.split(",")
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    tag = "h100" if "H100" in gpu else gpu.lower()
    RESULTS.mkdir(parents=True, exist_ok=True)
    roof = copy_roofline()
    print(f"{gpu}: copy roofline {roof / 1e9:.0f} GB/s", flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    state_dtypes = [getattr(torch, d) for d in args.state_dtypes.split(",")]
    if args.tune:
        rows = tune(models, args.quick, args.tune.split(","), batches, state_dtypes)
        out = args.tune_out or RESULTS / f"kernel-tuning-{tag}.json"
        out.write_text(json.dumps(rows, indent=1))
        return  # the comparison runs in its own invocation, with the tuned tables in place

    import vllm

    rows = []
    compare = args.compare.split(",")
    points = list(itertools.product(state_dtypes, batches))

    def points_of(part: str) -> list:
        """The (state dtype, batch) points of one part of the comparison, none if not asked."""
        return points if part in compare else []

    def record(kernel, model, sdt, batch, ours_us, vllm_us, nbytes_ours, nbytes_vllm):
        copy = copy_us(nbytes_ours)
        row = dict(
            kernel=kernel,
            model=model,
            state_dtype=sdt,
            batch=batch,
            ours_us=round(ours_us, 3),
            vllm_us=round(vllm_us, 3),
            ours_roofline=round(nbytes_ours / (ours_us * 1e-6) / roof, 4),
            vllm_roofline=round(nbytes_vllm / (vllm_us * 1e-6) / roof, 4),
            # A plain copy of our kernel's bytes: the fraction of the roofline that size allows.
            copy_us=round(copy, 3),
            copy_roofline=round(nbytes_ours / (copy * 1e-6) / roof, 4),
        )
        rows.append(row)
        print(
            f"{kernel:22s} {model:12s} {sdt:9s} B={batch:4d} ours {ours_us:8.2f}us "
            f"{100 * row['ours_roofline']:5.1f}%  vllm {vllm_us:8.2f}us "
            f"{100 * row['vllm_roofline']:5.1f}%  x{vllm_us / ours_us:4.2f}  "
            f"copy {copy:8.2f}us {100 * row['copy_roofline']:5.1f}%",
            flush=True,
        )

    for model in models:
        sh = shape_of(model)
        for sdt, batch in points_of("selective_state_update"):
            name = str(sdt)[6:]
            nb = ssu_bytes(sh, batch, sdt, True)
            record(
                "selective_state_update",
                model,
                name,
                batch,
                time_rotating(lambda: ours_ssu(ssu_inputs(sh, batch, sdt)), nb),
                time_rotating(lambda: vllm_ssu(ssu_inputs(sh, batch, sdt), sh), nb),
                nb,
                nb,
            )
        for batch in batches if "conv_and_norm" in compare else ():
            nb = conv_bytes(sh, batch)
            record(
                "causal_conv1d_update",
                model,
                "-",
                batch,
                time_rotating(lambda: ours_conv(conv_inputs(sh, batch)), nb),
                time_rotating(lambda: vllm_conv(conv_inputs(sh, batch)), nb),
                nb,
                nb,
            )
            nb = norm_bytes(sh, batch, True)
            record(
                "group_rms_norm_gated",
                model,
                "-",
                batch,
                time_rotating(lambda: ours_norm(norm_inputs(sh, batch), sh, True), nb),
                time_rotating(lambda: vllm_gated_norm(norm_inputs(sh, batch), sh), nb),
                nb,
                nb,
            )
        # The decode tail of one Mamba layer: conv -> state update -> norm.
        for sdt, batch in points_of("decode_tail"):
            name = str(sdt)[6:]

            def tail(ours: bool):
                c, s, n = (
                    conv_inputs(sh, batch),
                    ssu_inputs(sh, batch, sdt, gate=ours),
                    norm_inputs(sh, batch),
                )
                steps = (
                    [ours_conv(c), ours_ssu(s), ours_norm(n, sh, False)]
                    if ours
                    else [vllm_conv(c), vllm_ssu(s, sh), vllm_gated_norm(n, sh)]
                )
                return lambda: [f() for f in steps]

            nb_o = (
                conv_bytes(sh, batch)
                + ssu_bytes(sh, batch, sdt, True)
                + norm_bytes(sh, batch, False)
            )
            nb_v = (
                conv_bytes(sh, batch)
                + ssu_bytes(sh, batch, sdt, False)
                + norm_bytes(sh, batch, True)
            )
            vllm_us = time_rotating(lambda: tail(False), nb_v)
            record(
                "decode_tail",
                model,
                name,
                batch,
                time_rotating(lambda: tail(True), nb_o),
                vllm_us,
                nb_o,
                nb_v,
            )
            # The fusions, each against the same vLLM tail: conv into the state update (norm
            # apart), then the norm into its epilogue too.
            nb_f = fused_bytes(sh, batch, sdt)
            for kernel, norm in (("decode_tail_fused_conv", False), ("decode_tail_fused", True)):
                us = time_rotating(lambda: ours_fused(fused_inputs(sh, batch, sdt), sh, norm), nb_f)
                record(kernel, model, name, batch, us, vllm_us, nb_f, nb_v)

        # The prefill's state copies through the rows' slots (both implementations did them
        # with PyTorch indexing before).
        for sdt, batch in points_of("state_slot_copy"):
            name = str(sdt)[6:]
            nb = slot_copy_bytes(sh, batch, sdt)
            for kernel, ours, theirs in (
                ("scatter_state_slots", ours_scatter, vllm_scatter),
                ("gather_state_slots", ours_gather, vllm_gather),
            ):
                us_o = time_rotating(lambda: ours(slot_copy_inputs(sh, batch, sdt)), nb)
                us_v = time_rotating(lambda: theirs(slot_copy_inputs(sh, batch, sdt)), nb)
                record(kernel, model, name, batch, us_o, us_v, nb, nb)

    meta = dict(
        gpu=gpu,
        torch=torch.__version__,
        triton=triton.__version__,
        vllm=vllm.__version__,
        python=platform.python_version(),
        date=time.strftime("%Y-%m-%d"),
        roofline_GBps=round(roof / 1e9, 1),
    )
    out = args.output or RESULTS / f"kernels-{tag}.json"
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    plot(rows, out.with_suffix(".png"), meta)
    print("wrote", out)


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = sorted({r["kernel"] for r in rows})
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(
        len(kernels), len(models), figsize=(5 * len(models), 3.2 * len(kernels)), squeeze=False
    )
    for (i, k), (j, m) in itertools.product(enumerate(kernels), enumerate(models)):
        ax = axes[i][j]
        for sdt in sorted({r["state_dtype"] for r in rows if r["kernel"] == k}):
            sel = [
                r for r in rows if r["kernel"] == k and r["model"] == m and r["state_dtype"] == sdt
            ]
            if not sel:
                continue
            b = [r["batch"] for r in sel]
            ax.plot(b, [100 * r["ours_roofline"] for r in sel], "o-", label=f"ours {sdt}")
            ax.plot(b, [100 * r["vllm_roofline"] for r in sel], "x--", label=f"vLLM {sdt}")
            if all("copy_roofline" in r for r in sel):
                copy = [100 * r["copy_roofline"] for r in sel]
                ax.plot(b, copy, ":", color="grey", label=f"copy of the bytes {sdt}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 110)
        ax.set_title(f"{k} / {m}", fontsize=9)
        ax.set_ylabel("% of copy roofline")
        ax.legend(fontsize=6)
    fig.suptitle(f"{meta['gpu']}, vLLM {meta['vllm']}, triton {meta['triton']}, {meta['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
