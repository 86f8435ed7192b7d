"""Checks at model load. A config no Nemotron-H model can be (or a bad plugin option) fails
naming the field and the allowed values; a config or engine feature vLLM's built-in model
runs but the plugin does not is handed back to the built-in (``hand_back_reason``), so that
installing the plugin never refuses what vLLM accepts."""

from __future__ import annotations

from typing import Any

from vllm_nemotron_h.model_executor.ssm_state_cache import StateLayout
from vllm_nemotron_h.ops.support import (
    CONV_WIDTH_RANGE,
    D_STATE_RANGE,
    HEAD_DIM_RANGE,
    RING_SIZES,
    tensor_parallel_split_problem,
)
from vllm_nemotron_h.vllm_boundary.config import (
    VllmConfig,
    additional_config,
    mamba_backend,
    mamba_cache_mode,
    on_cpu,
    prefix_caching_enabled,
    replayssm_buffer_len,
    replayssm_enabled,
    set_additional_config,
    set_mamba_cache_mode,
    speculative_method,
    speculative_tokens,
    stochastic_rounding_enabled,
    turn_off_replayssm,
)
from vllm_nemotron_h.vllm_boundary.engine_log import plugin_logger

LAYER_TYPES = {"M": "Mamba2", "*": "attention", "-": "MLP", "E": "MoE"}

# The plugin's options: additional_config={"nemotron_h": {option: value}}, first value the
# default.
OPTIONS_SECTION = "nemotron_h"
SSM_STATE_FORMATS = {
    "auto": "vLLM's float SSM state (dtype from mamba_ssm_cache_dtype)",
    "int8": "int8 rows with one fp32 scale per (head, head_dim row)",
}
DEFERRED_STATE_WRITES = {
    0: "off: the SSM state is written at every token",
    **{
        n: f"the SSM state written every {n} tokens, a ring of the tokens since kept per slot"
        for n in RING_SIZES
    },
}
OPTIONS = {"ssm_state": SSM_STATE_FORMATS, "deferred_state_writes": DEFERRED_STATE_WRITES}
# Speculative methods whose drafts the plugin's model verifies (ops/mamba2_speculative_decode):
# drafts from the tokens alone, drafts of the checkpoint's MTP layers (vLLM's nemotron_h_mtp
# reads the target's hidden states, which the plugin's model returns as vLLM's does), and
# those of a draft model (its proposer run on its own KV-cache group: vllm_boundary.draft_model).
# EAGLE heads run with vLLM's model.
SPECULATIVE_METHODS = ("ngram", "ngram_gpu", "suffix", "mtp", "draft_model")


def plugin_mamba_backends() -> tuple[str, ...]:
    """The ``--mamba-backend`` values in whose place the plugin's state update runs: vLLM's
    default, and on a CPU its CPU op (which the plugin's CPU decode runs too). FlashInfer's
    (and its ``--mamba-ssu-algorithm``) is vLLM's model's to run."""
    return ("triton", "cpu") if on_cpu() else ("triton",)


class UnsupportedConfigError(ValueError):
    """A config field or engine option vllm-nemotron-h does not support."""


def _fail(field: str, value: Any, allowed: str) -> None:
    raise UnsupportedConfigError(
        f"vllm-nemotron-h: unsupported {field}={value!r}; supported: {allowed} (no Nemotron-H "
        "model has this; vLLM's built-in model cannot build it either)"
    )


def plugin_options(vllm_config: VllmConfig) -> dict[str, Any]:
    """The plugin's options from ``additional_config["nemotron_h"]``, defaults filled in;
    raises UnsupportedConfigError naming an unknown key or value and what is allowed."""
    section = additional_config(vllm_config).get(OPTIONS_SECTION, {})
    where = f"additional_config[{OPTIONS_SECTION!r}]"
    if not isinstance(section, dict):
        raise UnsupportedConfigError(
            f"vllm-nemotron-h: {where} must be a dict of options, got {section!r}; "
            f"options: {sorted(OPTIONS)}"
        )
    unknown = sorted(set(section) - set(OPTIONS))
    if unknown:
        raise UnsupportedConfigError(
            f"vllm-nemotron-h: unknown option {where}[{unknown[0]!r}]; options: {sorted(OPTIONS)}"
        )
    options = {}
    for key, allowed in OPTIONS.items():
        value = section.get(key, next(iter(allowed)))
        if value not in allowed:
            described = "; ".join(f"{v!r} ({what})" for v, what in allowed.items())
            raise UnsupportedConfigError(
                f"vllm-nemotron-h: unsupported {where}[{key!r}]={value!r}; allowed: {described}"
            )
        options[key] = value
    return options


def ssm_state_format(vllm_config: VllmConfig) -> str:
    """'auto' or 'int8' (see SSM_STATE_FORMATS)."""
    return plugin_options(vllm_config)["ssm_state"]


def deferred_writes_off_reason(vllm_config: VllmConfig) -> str | None:
    """Why deferred state writes, though asked for, do not run (the state is then written at
    every token), or None."""
    if not plugin_options(vllm_config)["deferred_state_writes"]:
        return None
    return _deferred_writes_excluded(vllm_config)


def _deferred_writes_excluded(vllm_config: VllmConfig) -> str | None:
    """What in the engine's config keeps deferred writes from running, or None."""
    if speculative_tokens(vllm_config):
        return "speculative decoding keeps a state after every draft token"
    handed_back = _plugin_cannot_run(vllm_config)
    if handed_back:  # vLLM's model declares its own states: no rings beside them
        return f"vLLM's built-in model serves this config ({handed_back})"
    return None


def align_for_plugin_states(vllm_config: VllmConfig) -> None:
    """With prefix caching and a state only the plugin has (int8, deferred writes), Mamba
    cache mode 'align', the mode the plugin runs, where vLLM has not chosen one yet: vLLM
    0.26 would choose 'all', which its own model runs, without those states. Runs where vLLM
    updates the config for the architecture, before vLLM chooses the mode; one log line."""
    options = plugin_options(vllm_config)
    own = {k: v for k, v in options.items() if v != next(iter(OPTIONS[k]))}
    if not own or not prefix_caching_enabled(vllm_config):
        return
    if mamba_cache_mode(vllm_config) != "none":  # asked for: 'all' is handed back, named
        return
    if _plugin_cannot_run(vllm_config):  # vLLM's model serves it anyway: its mode stands
        return
    set_mamba_cache_mode(vllm_config, "align")
    plugin_logger().info(
        "vllm-nemotron-h: prefix caching with additional_config['nemotron_h'] %s: Mamba cache "
        "mode 'align', in which the plugin runs these states",
        ", ".join(f"{k}={v!r}" for k, v in own.items()),
    )


def deferred_writes_for_replayssm(vllm_config: VllmConfig) -> None:
    """Where vLLM's ReplaySSM is asked for (``use_replayssm``, vLLM >= 0.27) and the plugin
    serves the model with deferred writes, they take its place: the ring as long as
    ReplaySSM's buffer (``replayssm_buffer_len``) unless ``deferred_state_writes`` is set,
    ReplaySSM turned off, one log line. Runs where vLLM updates the config for the
    architecture, in the process that makes it, before any engine process reads it; where
    the plugin would not defer, ReplaySSM stays and vLLM's model serves it
    (hand_back_reason says why)."""
    if not replayssm_enabled(vllm_config) or _replayssm_stays(vllm_config):
        return
    ring = _replayssm_ring(vllm_config)
    set_additional_config(vllm_config, OPTIONS_SECTION, "deferred_state_writes", ring)
    turn_off_replayssm(vllm_config)
    plugin_logger().info(
        "vllm-nemotron-h: use_replayssm=True: the plugin's deferred state writes (every %d "
        "tokens, a ring of the tokens since per slot) run in place of vLLM's ReplaySSM",
        ring,
    )


def _replayssm_ring(vllm_config: VllmConfig) -> int:
    """The ring deferred writes keep in ReplaySSM's place: the one set, else ReplaySSM's."""
    return plugin_options(vllm_config)["deferred_state_writes"] or replayssm_buffer_len(vllm_config)


def _replayssm_stays(vllm_config: VllmConfig) -> str | None:
    """Why vLLM's ReplaySSM, asked for, is not replaced by the plugin's deferred writes, or
    None."""
    try:
        validate(vllm_config)  # the plugin's options among the rest
    except UnsupportedConfigError as e:  # the model load raises it
        return str(e)
    reason = _plugin_cannot_run(vllm_config)
    if reason:
        return reason
    ring = _replayssm_ring(vllm_config)
    if ring not in RING_SIZES:
        return (
            f"replayssm_buffer_len={ring}, the plugin's deferred writes keep rings of "
            f"{', '.join(map(str, RING_SIZES))} tokens"
        )
    excluded = _deferred_writes_excluded(vllm_config)
    if excluded:
        return f"the plugin's deferred writes do not run here: {excluded}"
    return None


def state_layout(vllm_config: VllmConfig) -> StateLayout:
    """The layer state's format and ring size as they run for this config."""
    options = plugin_options(vllm_config)
    ring = 0 if deferred_writes_off_reason(vllm_config) else options["deferred_state_writes"]
    return StateLayout(options["ssm_state"], ring)


def validate(vllm_config: VllmConfig) -> None:
    """Raises UnsupportedConfigError for a bad plugin option or a layer pattern / head
    grouping that no Nemotron-H model has (vLLM's model cannot build it either)."""
    plugin_options(vllm_config)
    config = vllm_config.model_config.hf_config
    pattern = config.hybrid_override_pattern
    bad = sorted(set(pattern) - set(LAYER_TYPES))
    if bad:
        _fail(
            "hybrid_override_pattern",
            pattern,
            "characters " + ", ".join(f"{k!r} ({v})" for k, v in LAYER_TYPES.items()),
        )
    if "M" in pattern:
        heads, groups = config.mamba_num_heads, config.n_groups
        if groups <= 0 or heads % groups:
            _fail("n_groups", groups, f"a divisor of mamba_num_heads={heads}")


def hand_back_reason(vllm_config: VllmConfig) -> str | None:
    """Why vLLM's built-in model, not the plugin's, must serve this config ("field=value, the
    plugin runs ..."), or None. An int8 state exists only in the plugin: with it, a reason is
    an UnsupportedConfigError instead."""
    reason = _plugin_cannot_run(vllm_config)
    if reason is None and replayssm_enabled(vllm_config):
        stays = _replayssm_stays(vllm_config) or "vLLM did not run the plugin's config update"
        reason = f"use_replayssm=True, vLLM's ReplaySSM runs: {stays}"
    if reason and ssm_state_format(vllm_config) == "int8":
        raise UnsupportedConfigError(
            f"vllm-nemotron-h: additional_config['nemotron_h']['ssm_state']='int8' needs the "
            f"plugin's model, which does not run this config: {reason}"
        )
    return reason


def _plugin_cannot_run(vllm_config: VllmConfig) -> str | None:
    config = vllm_config.model_config.hf_config
    tp = vllm_config.parallel_config.tensor_parallel_size
    if "M" in config.hybrid_override_pattern:
        heads, groups = config.mamba_num_heads, config.n_groups
        for field, bounds in (
            ("mamba_head_dim", HEAD_DIM_RANGE),
            ("ssm_state_size", D_STATE_RANGE),
            ("conv_kernel", CONV_WIDTH_RANGE),
        ):
            value = getattr(config, field)
            if not bounds[0] <= value <= bounds[1]:
                return f"{field}={value}, the plugin's kernels take {bounds[0]}..{bounds[1]}"
        if config.mamba_hidden_act not in ("silu", "swish"):
            return f"mamba_hidden_act={config.mamba_hidden_act!r}, the plugin runs 'silu'"
        problem = tensor_parallel_split_problem(heads, groups, tp)
        if problem:
            return problem
    if mamba_cache_mode(vllm_config) not in ("none", "align"):
        return (
            f"mamba_cache_mode={mamba_cache_mode(vllm_config)!r}, the plugin runs 'none' "
            "and 'align' (mamba_cache_mode='align' runs the plugin with prefix caching)"
        )
    backend, served = mamba_backend(vllm_config), plugin_mamba_backends()
    if backend not in served:
        return (
            f"mamba_backend={backend!r}, the plugin's state update runs in place of "
            f"{' and '.join(map(repr, served))} (the default: no --mamba-backend)"
        )
    if stochastic_rounding_enabled(vllm_config):
        return (
            "enable_mamba_cache_stochastic_rounding=True, the plugin's state update rounds to "
            "nearest"
        )
    method = speculative_method(vllm_config)
    if speculative_tokens(vllm_config) and method not in SPECULATIVE_METHODS:
        return (
            f"speculative_config.method={method!r}, the plugin verifies drafts of "
            f"{', '.join(map(repr, SPECULATIVE_METHODS))}"
        )
    return None
