"""``NemotronHForCausalLM`` as the plugin builds it.

vLLM's classes provide the structure (embedding, attention, MLP/MoE layers, norms, LM head,
weight loading and name mapping, the hybrid-model class methods, torch.compile); while they
build, vLLM's layer registry makes the plugin's Mamba2 mixer where they ask for theirs, and on
CPU the MoE layers are the plugin's. The model's RMSNorms stay vLLM's: torch.compile fuses
them with the residual add into the graph around them, where an opaque op of the plugin's
costs over ten times a fused kernel's launch in host time, which a step without CUDA graphs
(a prefill beyond the captured sizes) pays once per layer, for a kernel barely faster
(benchmarks/NOTES.md). This module must not be named ``nemotron_h.py``:
vLLM caches model flags on disk keyed by the module's basename.
"""

from __future__ import annotations

import functools
import importlib.metadata

from vllm_nemotron_h.model_executor.mamba2_mixer import PluginMambaMixer2, norm_spans_ranks
from vllm_nemotron_h.model_executor.moe_cpu import CpuNemotronHMoEDecoderLayer
from vllm_nemotron_h.model_executor.native_cpu_decode import layout_runs_native_cpu_decode
from vllm_nemotron_h.model_executor.ssm_state_cache import INT8
from vllm_nemotron_h.model_executor.validation import (
    deferred_writes_off_reason,
    hand_back_reason,
    ssm_state_format,
    state_layout,
    validate,
)
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu_kernels import build_failure
from vllm_nemotron_h.vllm_boundary import cpu_ops
from vllm_nemotron_h.vllm_boundary.config import (
    VllmConfig,
    mamba_cache_mode,
    on_cpu,
    speculative_method,
    speculative_tokens,
    ssm_state_dtype,
    tensor_parallel_size_of,
)
from vllm_nemotron_h.vllm_boundary.draft_model import draft_model_uses_its_kv_group
from vllm_nemotron_h.vllm_boundary.engine_log import plugin_logger
from vllm_nemotron_h.vllm_boundary.layers import (
    VllmNemotronHForCausalLM,
    conv_state_channels,
    plugin_layers,
)


class NemotronHForCausalLM(VllmNemotronHForCausalLM):
    """The class vLLM builds for ``architectures: ["NemotronHForCausalLM"]`` with the plugin."""

    # Claimed so that vLLM 0.26 keeps its Mamba cache mode 'all' (its default for Nemotron-H
    # with prefix caching), which it would turn into 'align' for a class without the claim:
    # 'align' refuses token budgets 'all' takes. The plugin runs 'none' and 'align' (the
    # runner copies states between blocks) and hands 'all' to vLLM's model
    # (validation.hand_back_reason), so an engine runs as it would without the plugin.
    supports_mamba_prefix_caching = True

    def __new__(cls, *, vllm_config: VllmConfig, prefix: str = ""):
        """The plugin's model, or vLLM's built-in one where the plugin cannot run the config
        (hand_back_reason; one log line says why). vLLM's class methods, which the engine
        calls on this class before it builds the model, are the built-in's for such a config
        (the state format is then vLLM's)."""
        validate(vllm_config)
        reason = hand_back_reason(vllm_config)
        if reason is None:
            return super().__new__(cls)
        log_what_runs(
            f"vllm-nemotron-h {plugin_version()}: {reason}: vLLM's built-in "
            "NemotronHForCausalLM serves this model"
        )
        return VllmNemotronHForCausalLM(vllm_config=vllm_config, prefix=prefix)

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        log_what_runs(describe(vllm_config))
        if speculative_method(vllm_config) == "draft_model":
            draft_model_uses_its_kv_group()
        self.state_layout = state_layout(vllm_config)
        moe_layer = CpuNemotronHMoEDecoderLayer if on_cpu() else None
        with plugin_layers(PluginMambaMixer2, moe_layer):
            super().__init__(vllm_config=vllm_config, prefix=prefix)

    # The state tensors of a Mamba layer in vLLM's cache (ssm_state_cache.py), as the engine
    # sizes them from the config and as the layers declare them.
    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        shapes = tuple(super().get_mamba_state_shape_from_config(vllm_config))
        return state_layout(vllm_config).shapes(shapes, conv_state_channels(shapes[0]))

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        dtypes = super().get_mamba_state_dtype_from_config(vllm_config)
        return state_layout(vllm_config).dtypes(dtypes)

    # vLLM's model runner asks the model instance for these (the layout is the instance's).
    def get_mamba_state_copy_func(self):
        return self.state_layout.copy_funcs(super().get_mamba_state_copy_func())

    def get_mamba_state_copy_funcs(self, mamba_types):
        funcs = self.get_mamba_state_copy_func()
        return {mamba_type: funcs for mamba_type in mamba_types}


def plugin_version() -> str:
    try:
        return importlib.metadata.version("vllm-nemotron-h")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "(source tree)"


def describe(vllm_config: VllmConfig) -> str:
    """What runs where, as the engine log says it."""
    layout = state_layout(vllm_config)
    draft_tokens = speculative_tokens(vllm_config)
    if on_cpu():
        native = layout_runs_native_cpu_decode(layout)
        decode = (
            "vLLM's native CPU conv and state-update ops"
            if native
            else "the plugin's CPU path (PyTorch)"
        )
        if draft_tokens:
            decode += speculative_cpu_description(native, layout.ssm_format == INT8)
        prefill, moe = "CPU path", "MoE layers the plugin's CPU path"
    elif draft_tokens:
        decode = (
            "the plugin's Triton kernels for speculative decoding (conv, state update keeping "
            "each token's state, group norm)"
        )
        prefill, moe = "kernels", "MoE layers vLLM's"
    elif layout.ring_size:
        decode = (
            "the plugin's Triton kernels (fused conv + state update + gated norm, writing the "
            "state every token, up to the device table's batch x heads; conv update, deferred "
            "state update, group norm above, at the batch sizes where the table says deferring "
            "pays for the state format, else the per-step state update)"
        )
        prefill, moe = "kernels", "MoE layers vLLM's"
    else:
        decode = (
            "the plugin's Triton kernels (fused conv + state update + gated norm up to the "
            "device table's batch x heads, three kernels above)"
        )
        prefill, moe = "kernels", "MoE layers vLLM's"
    scan_launches = (
        ""
        if on_cpu()
        else " (the scan's kernels with the configs its autotuner chose, "
        "resolved once per layer shape and dtypes)"
    )
    after_op = norm_after_op_description(vllm_config)
    prefill_tail = ("" if after_op else "gated group norm, ") + "final states into their slots"
    return (
        f"vllm-nemotron-h {plugin_version()} serves NemotronHForCausalLM: Mamba2 decode on "
        f"{decode}{speculation_description(vllm_config)}{after_op}; "
        f"SSM state {state_description(vllm_config)}; {writes_description(vllm_config)}; "
        f"the prefill's initial-state gather and its tail ({prefill_tail}) on the plugin's "
        f"{prefill}, the prefill conv and chunked scan on vLLM's{scan_launches}; attention, MLP, "
        f"RMSNorm and linear layers vLLM's, {moe}; Mamba prefix caching mode "
        f"{mamba_cache_mode(vllm_config)!r}; tensor parallel {tensor_parallel_size_of(vllm_config)}"
    )


def norm_after_op_description(vllm_config: VllmConfig) -> str:
    """Where the Mamba mixer gates and normalises after its op rather than in the op's tail
    (the decode and prefill tails then leave y unnormalised), what the log adds."""
    if on_cpu():
        return (
            ", the gate and group norm after the mixer op in the graph torch.compile fuses "
            "(as vLLM's model)"
        )
    config = vllm_config.model_config.hf_config
    if "M" in config.hybrid_override_pattern and norm_spans_ranks(
        config.n_groups, tensor_parallel_size_of(vllm_config)
    ):
        return (
            ", the group norm after the mixer op (its one group spans the tensor-parallel "
            "ranks: the sum of squares all-reduced)"
        )
    return ""


def speculative_cpu_description(native: bool, int8_state: bool) -> str:
    """What a CPU step with drafts runs, as the log adds it to the decode path. Asking builds
    the plugin's compiled CPU ops (once a machine) or finds why they cannot be built, so that
    the engine's start pays for the build, not a step."""
    failure = build_failure()
    conv = (
        "the plugin's compiled CPU op"
        if failure is None
        else f"the plugin's PyTorch CPU path (its compiled ops could not be built: {failure})"
    )
    if native:
        prefix = " in steps without drafts; in the others"
    else:
        prefix = "; in steps with drafts"
    if int8_state or (failure is not None and not native):
        return f"{prefix} the conv on {conv}, the state recurrence in PyTorch"
    if failure is None:
        return (
            f"{prefix} the conv and the state recurrence on the plugin's compiled CPU ops "
            "(one call each a layer)"
        )
    carried = (
        "each row's state carried through its slots"
        if cpu_ops.state_update_writes_read_slots()
        else "each position's states in a block of their own (the installed op does "
        "not write the slots it reads)"
    )
    calls = (
        "in one call a layer where every row has 1 + drafts tokens, else once per token position"
        if cpu_ops.state_update_takes_token_rows()
        else "once per token position"
    )
    return f"{prefix} vLLM's native state update {calls} ({carried}), the conv on {conv}"


def speculation_description(vllm_config: VllmConfig) -> str:
    draft_tokens = speculative_tokens(vllm_config)
    if not draft_tokens:
        return ""
    method = speculative_method(vllm_config)
    return f", verifying {draft_tokens} draft tokens per step ({method} speculative decoding)"


def state_description(vllm_config: VllmConfig) -> str:
    if ssm_state_format(vllm_config) == "int8":
        return "int8 with an fp32 scale per row (additional_config nemotron_h.ssm_state)"
    return ssm_state_dtype(vllm_config)


def writes_description(vllm_config: VllmConfig) -> str:
    ring = state_layout(vllm_config).ring_size
    if ring:
        return (
            f"state writes deferred, every {ring} tokens with a ring of the tokens since per "
            "slot (additional_config nemotron_h.deferred_state_writes)"
        )
    off = deferred_writes_off_reason(vllm_config)
    if off:
        return f"state written every token (deferred writes asked for, but {off})"
    return "state written every token"


@functools.cache
def log_what_runs(description: str) -> None:
    """Once per process (and per distinct engine configuration in it)."""
    plugin_logger().info(description)
