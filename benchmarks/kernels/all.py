"""Every kernel benchmark in one run: the comparison behind benchmarks/results/kernels-<gpu>.json.

python benchmarks/kernels/all.py [--ops selective_state_update,..] [--models M,..]
"""

from __future__ import annotations

import causal_conv1d_update
import harness
import mamba2_decode
import mamba2_prefill_tail
import rms_norm
import selective_state_update
import state_slot_copy

OPS = {
    m.__name__: m.compare
    for m in (
        selective_state_update,
        causal_conv1d_update,
        rms_norm,
        mamba2_decode,
        state_slot_copy,
        mamba2_prefill_tail,
    )
}

if __name__ == "__main__":
    ap = harness.parser(__doc__)
    ap.add_argument("--ops", default=",".join(OPS), help=f"a subset of {','.join(OPS)}")
    args = ap.parse_args()
    harness.run([OPS[op] for op in args.ops.split(",")], "kernels", args)
