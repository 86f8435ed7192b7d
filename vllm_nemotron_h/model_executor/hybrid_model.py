"""``NemotronHForCausalLM`` as the plugin builds it.

vLLM's classes provide the structure (embedding, attention, MLP/MoE layers, LM head, weight
loading and name mapping, the hybrid-model class methods, torch.compile); while they build,
vLLM's layer registry makes the plugin's Mamba2 mixer and RMSNorm where they ask for theirs,
and on CPU the MoE layers are the plugin's. This module must not be named ``nemotron_h.py``:
vLLM caches model flags on disk keyed by the module's basename.
"""

from __future__ import annotations

from vllm_nemotron_h.model_executor.custom_ops import PluginRMSNorm
from vllm_nemotron_h.model_executor.mamba2_mixer import PluginMambaMixer2
from vllm_nemotron_h.model_executor.moe_cpu import CpuNemotronHMoEDecoderLayer
from vllm_nemotron_h.model_executor.validation import validate
from vllm_nemotron_h.vllm_boundary.config import VllmConfig
from vllm_nemotron_h.vllm_boundary.layers import (
    VllmNemotronHForCausalLM,
    on_cpu,
    plugin_layers,
)


class NemotronHForCausalLM(VllmNemotronHForCausalLM):
    """The class vLLM builds for ``architectures: ["NemotronHForCausalLM"]`` with the plugin."""

    # Prefix caching runs in vLLM's "align" mode (the runner copies states between blocks);
    # the "all" mode's per-block state writes inside the mixer are not implemented.
    supports_mamba_prefix_caching = False

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        validate(vllm_config)
        moe_layer = CpuNemotronHMoEDecoderLayer if on_cpu() else None
        with plugin_layers(PluginMambaMixer2, PluginRMSNorm, moe_layer):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
