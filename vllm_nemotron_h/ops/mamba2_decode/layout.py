"""The channel layout of a decode row, read by the kernel wrappers, the CPU path and the
reference alike: xbc = [x (nheads * head_dim) | B (ngroups * d_state) | C (ngroups * d_state)]."""

from __future__ import annotations

import torch


def ngroups_of(xbc_width: int, nheads: int, head_dim: int, d_state: int) -> int:
    """The number of B/C groups an xbc row of ``xbc_width`` channels holds."""
    return (xbc_width - nheads * head_dim) // (2 * d_state)


def split_xbc(
    xbc: torch.Tensor, nheads: int, head_dim: int, d_state: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views x (batch, nheads, head_dim), B and C (batch, ngroups, d_state) of ``xbc``
    (batch, conv_dim), whose channels are contiguous."""
    batch = xbc.shape[0]
    ngroups = ngroups_of(xbc.shape[1], nheads, head_dim, d_state)
    x, B, C = torch.split(xbc, [nheads * head_dim, ngroups * d_state, ngroups * d_state], -1)
    return (
        x.view(batch, nheads, head_dim),
        B.view(batch, ngroups, d_state),
        C.view(batch, ngroups, d_state),
    )
