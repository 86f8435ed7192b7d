"""The ``vllm.general_plugins`` entry point: vLLM calls ``register()`` in every process."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_nemotron_h.vllm_boundary.config import VllmConfig

MODEL_CLASS = "vllm_nemotron_h.model_executor.hybrid_model:NemotronHForCausalLM"
ARCHITECTURE = "NemotronHForCausalLM"
DISABLE_ENV = "VLLM_NEMOTRON_H_DISABLE"


def disabled() -> bool:
    """True when ``VLLM_NEMOTRON_H_DISABLE`` is set to 1/true/yes (vLLM's model then runs)."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes")


def register() -> None:
    """Registers the plugin's ``NemotronHForCausalLM`` lazily (by "module:Class" string, so no
    CUDA is touched in the parent process). Calling it again is harmless."""
    if disabled():
        from vllm_nemotron_h.vllm_boundary.engine_log import plugin_logger

        plugin_logger().info(
            "vllm-nemotron-h: %s=1, vLLM's built-in %s stays", DISABLE_ENV, ARCHITECTURE
        )
        return
    from vllm import ModelRegistry

    from vllm_nemotron_h.vllm_boundary.config import after_architecture_config_update

    after_architecture_config_update(ARCHITECTURE, update_config)
    registered = ModelRegistry.models.get(ARCHITECTURE)
    if getattr(registered, "module_name", None) == MODEL_CLASS.split(":")[0]:
        return
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)


def update_config(vllm_config: VllmConfig) -> None:
    """The plugin's part of vLLM's config update for the architecture: ReplaySSM, asked for,
    becomes the plugin's deferred writes where the plugin serves the model; prefix caching
    with the plugin's own states runs in the Mamba cache mode the plugin runs."""
    from vllm_nemotron_h.model_executor.validation import (
        align_for_plugin_states,
        deferred_writes_for_replayssm,
    )

    deferred_writes_for_replayssm(vllm_config)
    align_for_plugin_states(vllm_config)
