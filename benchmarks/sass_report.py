"""The machine code of a state-update kernel without a GPU: compiles it for sm_90 with the
Triton installed here (ptxas and cuobjdump ship with it) and prints, per launch config, what
decides a memory-bound kernel's speed before any timing: registers per thread (how many
programs fit on an SM), local-memory accesses (spills), global loads and stores, CTA barriers,
and how many instructions run before the first 16-byte state load and between the last state
load and the first state store. ``--kernel deferred_state_update`` reports the deferred
update's step (a token appended, ring of ``--ring``) instead of the per-step update.

    python benchmarks/sass_report.py [--kernel selective_state_update|deferred_state_update]
                                     [--configs 16x1,64x2] [--state-dtypes bf16,fp32,i8]
                                     [--head-dim 64] [--ring 16] [--dump DIR]

The GPU machine may run another Triton version (3.6 there): its code can differ; read this as
a lead, and time the variant on the GPU before keeping it. To compile with the GPU's version:
`pip download --no-deps triton==3.6.0`, unzip the wheel into a folder, make its
backends/nvidia/bin/* executable, and put the folder first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from vllm_nemotron_h.ops.deferred_state_update.kernel import _deferred_state_update_kernel
from vllm_nemotron_h.ops.selective_state_update.kernel import (
    _selective_state_update_kernel,
    takes_per_head_values,
)

TOOLS = Path(triton.__path__[0]) / "backends" / "nvidia" / "bin"
# Pointers, and the strides that are 1 in vLLM's tensors (Triton specialises those).
ACTIVATION_PTRS = ("x_ptr", "dt_ptr", "B_ptr", "C_ptr", "z_ptr", "out_ptr")
UNIT_STRIDES = ("x_d", "z_d", "o_d", "B_n", "C_n", "dt_h", "sc_dim")


def compile_sass(
    block_m: int,
    num_warps: int,
    tiles: int,
    state_dtype: str,
    head_dim: int,
    kernel_name: str = "selective_state_update",
    ring: int = 16,
) -> tuple:
    """(cuobjdump -sass text, its -res-usage text) of one launch config."""
    pointers = {name: "*bf16" for name in ACTIVATION_PTRS}
    pointers.update(state_ptr=f"*{state_dtype}", slots_ptr="*i64", scale_ptr="*fp32")
    pointers.update({name: "*fp32" for name in ("A_ptr", "D_ptr", "dt_bias_ptr")})
    quantized = state_dtype == "i8"
    if kernel_name == "deferred_state_update":  # a step: the token joins the ring
        kernel = _deferred_state_update_kernel
        constexprs = dict(
            HEAD_DIM=head_dim, RING=ring, QUANTIZED=quantized, HAS_Z=True, APPEND=True,
            BLOCK_M=block_m, BLOCK_N=128,
        )  # fmt: skip
        pointers.update(ring_x_ptr="*bf16", ring_B_ptr="*bf16", ring_dt_ptr="*fp32")
        pointers.update(ring_len_ptr="*i32")
    else:
        kernel = _selective_state_update_kernel
        constexprs = dict(
            HEAD_DIM=head_dim, QUANTIZED=quantized, HAS_Z=True, HAS_SLOTS=True,
            BLOCK_M=block_m, BLOCK_N=128, TILES=tiles,
            PER_HEAD=takes_per_head_values(quantized, head_dim, block_m * tiles),
            INLINE_PTX=True,
        )  # fmt: skip
        constexprs.update({name: 1 for name in UNIT_STRIDES})
    names = kernel.arg_names
    signature = {n: pointers.get(n, "constexpr" if n in constexprs else "i32") for n in names}
    # Tensors and strides as vLLM passes them: 16-byte aligned, multiples of 16.
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if signature[n] != "constexpr" and n != "null_slot"
    }
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(n),): v for n, v in constexprs.items()},
        attrs=attrs,
    )
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps)
    )
    cubin = (
        Path("/tmp") / f"{kernel_name}-{block_m}x{num_warps}x{tiles}-{state_dtype}-{head_dim}.cubin"
    )
    cubin.write_bytes(compiled.asm["cubin"])

    def dump(flag: str) -> str:
        cmd = [str(TOOLS / "cuobjdump"), flag, str(cubin)]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    return dump("-sass"), dump("-res-usage")


def summarize(sass: str, resources: str) -> dict:
    ops = [
        line.split("*/", 1)[1]
        for line in sass.splitlines()
        if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)
    ]
    state_loads = [i for i, op in enumerate(ops) if "LDG.E.128" in op]
    state_stores = [i for i, op in enumerate(ops) if "STG.E.128" in op]
    return dict(
        registers=int(re.search(r"REG:(\d+)", resources).group(1)),
        local=sum("LDL" in op or "STL" in op for op in ops),
        instructions=len(ops),
        LDG=sum("LDG" in op for op in ops),
        STG=sum("STG" in op for op in ops),
        BAR=sum("BAR.SYNC" in op for op in ops),
        before_first_state_load=state_loads[0] if state_loads else None,
        loads_to_stores=(state_stores[0] - state_loads[-1])
        if state_loads and state_stores
        else None,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--configs", default="16x1,32x1,64x2,16x4", help="BLOCK_MxNUM_WARPS[xTILES],..."
    )
    ap.add_argument("--state-dtypes", default="bf16,fp32")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument(
        "--kernel",
        choices=("selective_state_update", "deferred_state_update"),
        default="selective_state_update",
    )
    ap.add_argument("--ring", type=int, default=16, help="the deferred update's ring size")
    ap.add_argument("--dump", type=Path, help="also write each config's SASS here")
    args = ap.parse_args()
    print(
        f"{args.kernel}: triton {triton.__version__}, sm_90, head_dim {args.head_dim}, "
        "d_state 128, gated"
    )
    print(
        "config   state  regs  local  instr  per tile  LDG  STG  BAR  before 1st state load"
        "  last load->1st store"
    )
    for config in args.configs.split(","):
        block_m, num_warps, tiles = (int(v) for v in (config + "x1").split("x")[:3])
        for state_dtype in args.state_dtypes.split(","):
            sass, resources = compile_sass(
                block_m, num_warps, tiles, state_dtype, args.head_dim, args.kernel, args.ring
            )
            if args.dump:
                args.dump.mkdir(parents=True, exist_ok=True)
                (args.dump / f"{args.kernel}-{config}-{state_dtype}.sass").write_text(sass)
            r = summarize(sass, resources)
            print(
                f"{config:8s} {state_dtype:5s} {r['registers']:5d} {r['local']:6d} "
                f"{r['instructions']:6d} {r['instructions'] / tiles:9.0f} "
                f"{r['LDG']:4d} {r['STG']:4d} {r['BAR']:4d} {r['before_first_state_load']!s:>21s} "
                f"{r['loads_to_stores']!s:>21s}"
            )


if __name__ == "__main__":
    main()
