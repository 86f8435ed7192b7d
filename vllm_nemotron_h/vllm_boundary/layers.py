"""vLLM's model building blocks the plugin builds on: its Nemotron-H classes, the Mamba2
mixer the plugin specialises, the out-of-tree layer registry, the mixer's custom op, the
forward context, weight-loading and tensor-parallel helpers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from vllm.config import get_layers_from_vllm_config
from vllm.distributed import (
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.forward_context import get_forward_context
from vllm.model_executor import custom_op
from vllm.model_executor.layers.fused_moe import GateLinear
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.model_loader.weight_utils import sharded_weight_loader
from vllm.model_executor.models import nemotron_h as vllm_nemotron_h
from vllm.model_executor.models.utils import extract_layer_index
from vllm.model_executor.utils import set_weight_attrs
from vllm.utils.torch_utils import _encode_layer_name

VllmNemotronHForCausalLM = vllm_nemotron_h.NemotronHForCausalLM
NemotronHMLP = vllm_nemotron_h.NemotronHMLP
NemotronHMoEDecoderLayer = vllm_nemotron_h.NemotronHMoEDecoderLayer

__all__ = [
    "GateLinear",
    "MambaMixer2",
    "NemotronHMLP",
    "NemotronHMoEDecoderLayer",
    "RMSNorm",
    "ReplicatedLinear",
    "VllmNemotronHForCausalLM",
    "all_reduce",
    "bare_module_init",
    "conv_state_channels",
    "first_in_forward",
    "fp32_head_parameter",
    "mixer_op",
    "mixer_states",
    "mixers_of",
    "plugin_layers",
    "step_metadata",
    "tensor_parallel_size",
]

# The MambaMixer2 attributes the plugin's mixer reads (set by vLLM's __init__, or by its
# KV-cache binding for kv_cache); the contract test checks each still exists.
MIXER_ATTRIBUTES = (
    "in_proj",
    "out_proj",
    "conv1d",
    "conv_weights",
    "norm",
    "A",
    "activation",
    "split_hidden_states_B_C_fn",
    "num_heads",
    "head_dim",
    "n_groups",
    "ssm_state_size",
    "conv_kernel_size",
    "intermediate_size",
    "tp_size",
    "tped_intermediate_size",
    "tped_conv_size",
    "tped_dt_size",
    "prefix",
    "kv_cache",
)

all_reduce = tensor_model_parallel_all_reduce
tensor_parallel_size = get_tensor_model_parallel_world_size


@contextlib.contextmanager
def plugin_layers(mixer: type[MambaMixer2], moe_layer: type[nn.Module] | None) -> Iterator[None]:
    """While vLLM's Nemotron-H model is built: its ``MambaMixer2(...)`` calls make the
    plugin's class (vLLM's out-of-tree layer registry, looked up by class name at
    instantiation), and ``moe_layer`` (when given) builds its "E" layers. Scoped to the build:
    the registry is process-wide and other Mamba2 models must keep vLLM's."""
    registry = custom_op.op_registry_oot
    layer_types = vllm_nemotron_h.ALL_DECODER_LAYER_TYPES
    saved, saved_moe = registry.get("MambaMixer2"), layer_types["E"]
    registry["MambaMixer2"] = mixer
    if moe_layer is not None:
        layer_types["E"] = moe_layer
    try:
        yield
    finally:
        layer_types["E"] = saved_moe
        if saved is None:
            registry.pop("MambaMixer2", None)
        else:
            registry["MambaMixer2"] = saved


def bare_module_init(layer: nn.Module) -> None:
    """Initialises ``layer`` as a bare nn.Module instead of running its vLLM ``__init__``
    (which would build vLLM's FusedMoE, refused on CPU for Nemotron-H's relu2 experts)."""
    nn.Module.__init__(layer)


def mixer_op(projected_states: torch.Tensor, output: torch.Tensor, prefix: str) -> None:
    """vLLM's ``vllm::mamba_mixer2`` op: a torch.compile graph split point (CUDA graphs are
    captured around it) that calls back the layer's ``conv_ssm_forward``."""
    torch.ops.vllm.mamba_mixer2(projected_states, output, _encode_layer_name(prefix))


def step_metadata(prefix: str) -> Any:
    """This step's attention metadata of the layer ``prefix``; None in the profile run."""
    metadata = get_forward_context().attn_metadata
    return metadata.get(prefix) if metadata is not None else None


def mixer_states(mixer: MambaMixer2) -> tuple[torch.Tensor, ...]:
    """The tensors of the layer's bound state cache in the order the layer declares them:
    the conv state as (slots, dim, width - 1), then the SSM state and whatever the plugin's
    options add (model_executor/ssm_state_cache.py). vLLM binds one tensor per state shape."""
    conv_state, *others = mixer.kv_cache
    if not is_conv_state_dim_first():
        conv_state = conv_state.transpose(-1, -2)
    return (conv_state, *others)


def conv_state_channels(conv_shape: tuple[int, ...]) -> int:
    """The channels (conv dim) of a conv state's per-slot shape as vLLM declares it."""
    return conv_shape[0] if is_conv_state_dim_first() else conv_shape[1]


def mixers_of(vllm_config: Any, layer_names: list[str]) -> list[MambaMixer2]:
    """The Mamba2 mixers named ``layer_names`` (a KV-cache group's), from vLLM's registry of
    layers by name."""
    return list(get_layers_from_vllm_config(vllm_config, MambaMixer2, layer_names).values())


def first_in_forward(layer_names: list[str]) -> str:
    """The layer of ``layer_names`` that the model's forward runs first: the lowest layer
    index, as vLLM reads it from a layer's name when it groups layers into KV-cache groups."""
    return min(layer_names, key=extract_layer_index)


def fp32_head_parameter(heads: int) -> nn.Parameter:
    """A per-head fp32 parameter loaded as vLLM shards D and dt_bias (dim 0 across ranks)."""
    param = nn.Parameter(torch.ones(heads, dtype=torch.float32))
    set_weight_attrs(param, {"weight_loader": sharded_weight_loader(0)})
    return param
