"""``NemotronHForCausalLM`` as the plugin builds it.

vLLM's classes provide the structure (embedding, attention, MLP/MoE layers, LM head, weight
loading and name mapping, the hybrid-model class methods); the plugin swaps in its Mamba2
mixer and its RMSNorm kernel, and a CPU MoE path. This module must not be named
``nemotron_h.py``: vLLM caches model flags on disk keyed by the module's basename.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.models import nemotron_h as vllm_nemotron_h
from vllm.platforms import current_platform

from vllm_nemotron_h.compat import swapped_attribute
from vllm_nemotron_h.model_executor.custom_ops import RMSNorm
from vllm_nemotron_h.model_executor.mamba2_mixer import PluginMambaMixer2
from vllm_nemotron_h.model_executor.moe_cpu import CpuNemotronHMoEDecoderLayer
from vllm_nemotron_h.model_executor.validation import validate


def _with_plugin_norm(base: type[nn.Module]) -> type[nn.Module]:
    """vLLM's decoder layer of type ``base``, its RMSNorm replaced by the plugin's kernel."""

    class Layer(base):
        def __init__(self, config, layer_idx: int, *args, **kwargs) -> None:
            super().__init__(config, layer_idx, *args, **kwargs)
            self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    Layer.__name__ = Layer.__qualname__ = base.__name__
    return Layer


class MambaDecoderLayer(vllm_nemotron_h.NemotronHMambaDecoderLayer):
    """vLLM's Mamba decoder layer (its forward) around the plugin's mixer and norm."""

    def __init__(
        self,
        config,
        layer_idx: int,
        model_config=None,
        cache_config=None,
        quant_config=None,
        parallel_config=None,
        prefix: str = "",
    ) -> None:
        nn.Module.__init__(self)  # vLLM's __init__ would register its own mixer first
        self.config = config
        self.mixer = PluginMambaMixer2(
            hidden_size=config.hidden_size,
            ssm_state_size=config.ssm_state_size,
            conv_kernel_size=config.conv_kernel,
            intermediate_size=config.mamba_num_heads * config.mamba_head_dim,
            use_conv_bias=config.use_conv_bias,
            use_bias=config.use_bias,
            n_groups=config.n_groups,
            num_heads=config.mamba_num_heads,
            head_dim=config.mamba_head_dim,
            rms_norm_eps=config.layer_norm_epsilon,
            activation=config.mamba_hidden_act,
            model_config=model_config,
            cache_config=cache_config,
            quant_config=quant_config,
            prefix=f"{prefix}.mixer",
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)


def decoder_layer_types() -> Mapping[str, type[nn.Module]]:
    moe = (
        CpuNemotronHMoEDecoderLayer
        if current_platform.is_cpu()
        else _with_plugin_norm(vllm_nemotron_h.NemotronHMoEDecoderLayer)
    )
    return {
        "M": MambaDecoderLayer,
        "*": _with_plugin_norm(vllm_nemotron_h.NemotronHAttentionDecoderLayer),
        "-": _with_plugin_norm(vllm_nemotron_h.NemotronHMLPDecoderLayer),
        "E": moe,
    }


@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        "positions": -1,
        "intermediate_tensors": 0,
        "inputs_embeds": 0,
    }
)
class NemotronHPluginModel(vllm_nemotron_h.NemotronHModel):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(
            vllm_config=vllm_config, prefix=prefix, decoder_layer_types=decoder_layer_types()
        )
        config = vllm_config.model_config.hf_config
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)


class NemotronHForCausalLM(vllm_nemotron_h.NemotronHForCausalLM):
    """The class vLLM builds for ``architectures: ["NemotronHForCausalLM"]`` with the plugin."""

    # Prefix caching runs in vLLM's "align" mode (the runner copies states between blocks);
    # the "all" mode's per-block state writes inside the mixer are not implemented.
    supports_mamba_prefix_caching = False

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        validate(vllm_config)
        # vLLM's __init__ builds the LM head and the MoE bookkeeping around a
        # NemotronHModel looked up in its module: let it build the plugin's model instead.
        with swapped_attribute(vllm_nemotron_h, "NemotronHModel", NemotronHPluginModel):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
