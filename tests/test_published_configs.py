"""The family's configs as published, config only (no weights on CPU): vLLM's engine config is
made from each config.json as a user's `vllm serve` makes it, and the plugin decides to serve
it (no hand-back), sizes its state from it and says what runs. Both schemas: the model cards'
(transformers 4.x: a ``hybrid_override_pattern`` string) and transformers 5's
(``layers_block_type`` lists); and the fields of newer members on a published config: latent
MoE and MTP layers. Per-layer MLP sizes (heterogeneous, Puzzle models) do not get past the
config parser of transformers 5.19."""

from __future__ import annotations

import pytest

from vllm_nemotron_h.testing.checkpoints import (
    REAL_SHAPES,
    write_published_config,
    write_real_shape_config,
)

CASES = [
    *((model, "model card", {}) for model in sorted(REAL_SHAPES)),
    *((model, "transformers 5", {}) for model in sorted(REAL_SHAPES)),
    ("nano-v3-30b", "model card", dict(moe_latent_size=1024)),
    (
        "nano-v3-30b",
        "model card",
        dict(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E"),
    ),
]
# One MLP size per "-" layer, as heterogeneous (Puzzle) models give them and vLLM's model code
# indexes them: transformers 5.19's NemotronHConfig types the field as an int and refuses the
# list while the config is parsed, before any model class is chosen (the built-in's too).
PER_LAYER_MLP_SIZES = dict(intermediate_size=[21504, 16384] * 12)


@pytest.mark.parametrize("model, schema, changes", CASES)
def test_published_config_is_served_by_the_plugin(model, schema, changes, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_nemotron_h.model_executor.hybrid_model import NemotronHForCausalLM, describe
    from vllm_nemotron_h.model_executor.validation import hand_back_reason, validate

    if schema == "model card":
        path = write_published_config(tmp_path / model, model, **changes)
    else:
        path = write_real_shape_config(tmp_path / model, model)
    args = EngineArgs(
        model=str(path), skip_tokenizer_init=True, load_format="dummy", max_model_len=2048
    )
    vllm_config = args.create_engine_config()
    hf = vllm_config.model_config.hf_config
    shape = REAL_SHAPES[model]
    for field, value in {**shape, **changes}.items():
        assert getattr(hf, field) == value, field
    validate(vllm_config)
    assert hand_back_reason(vllm_config) is None
    conv_shape, ssm_shape = NemotronHForCausalLM.get_mamba_state_shape_from_config(vllm_config)
    heads, head_dim, d_state = (
        shape["mamba_num_heads"],
        shape["mamba_head_dim"],
        shape["ssm_state_size"],
    )
    assert tuple(ssm_shape) == (heads, head_dim, d_state)
    conv_dim = heads * head_dim + 2 * shape["n_groups"] * d_state
    assert sorted(conv_shape) == sorted((conv_dim, 3))
    assert "serves NemotronHForCausalLM" in describe(vllm_config)


def test_per_layer_mlp_sizes_are_refused_while_the_config_is_parsed(tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    path = write_published_config(tmp_path / "8b", "nemotron-h-8b", **PER_LAYER_MLP_SIZES)
    args = EngineArgs(
        model=str(path), skip_tokenizer_init=True, load_format="dummy", max_model_len=2048
    )
    with pytest.raises(Exception, match="intermediate_size"):
        args.create_engine_config()
