"""The FP8 copy of a checkpoint (testing/checkpoints.py) that the GPU tests load: the
compressed-tensors layout vLLM reads, the projections within FP8's rounding of the original,
everything else unchanged. vLLM's FP8 linear layers run on GPUs (tests/gpu)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from tests.engines import ROOT
from vllm_nemotron_h.testing.checkpoints import (
    FP8_E4M3_MAX,
    is_fp8_projection,
    write_fp8_checkpoint,
)

SHIPPED = ROOT / "models" / "nemotron-h-pycode"


def test_fp8_copy_of_the_shipped_model(tmp_path):
    fp8 = write_fp8_checkpoint(SHIPPED, tmp_path / "fp8")
    original = load_file(str(SHIPPED / "model.safetensors"))
    copied = load_file(str(fp8 / "model.safetensors"))
    projections = [name for name in original if is_fp8_projection(name)]
    # every kind of projection: Mamba, attention, MLP, routed and shared experts
    for part in ("in_proj", "out_proj", "q_proj", "o_proj", "up_proj", "experts.0.", "shared_"):
        assert any(part in name for name in projections), part
    for name, weight in original.items():
        if name not in projections:
            assert torch.equal(copied[name], weight), name
            continue
        q, scale = copied[name], copied[name.removesuffix("weight") + "weight_scale"]
        assert q.dtype == torch.float8_e4m3fn and q.shape == weight.shape, name
        assert scale.dtype == torch.float32 and scale.shape == (weight.shape[0], 1), name
        w = weight.float()
        # the row's largest value maps to FP8's largest; e4m3 keeps 3 mantissa bits
        assert torch.allclose(q.float().abs().amax(1), torch.full_like(scale[:, 0], FP8_E4M3_MAX))
        err = (q.float() * scale - w).abs()
        assert (err <= w.abs() * 2**-4 + scale * 2**-9).all(), name
    cfg = json.loads((fp8 / "config.json").read_text())
    quant = cfg.pop("quantization_config")
    assert quant["quant_method"] == "compressed-tensors" and quant["format"] == "float-quantized"
    assert quant["ignore"] == ["lm_head"]
    assert cfg == json.loads((SHIPPED / "config.json").read_text())
    assert (fp8 / "tokenizer.json").read_bytes() == (SHIPPED / "tokenizer.json").read_bytes()


def test_fp8_copy_keeps_the_named_projections(tmp_path):
    fp8 = write_fp8_checkpoint(SHIPPED, tmp_path / "fp8", keep=("in_proj",))
    original = load_file(str(SHIPPED / "model.safetensors"))
    copied = load_file(str(fp8 / "model.safetensors"))
    for name, weight in original.items():
        if ".in_proj." in name:
            assert torch.equal(copied[name], weight) and name + "_scale" not in copied, name
        elif is_fp8_projection(name):
            assert copied[name].dtype == torch.float8_e4m3fn, name
    ignore = json.loads((fp8 / "config.json").read_text())["quantization_config"]["ignore"]
    assert ignore == ["lm_head", r"re:.*\.in_proj$"]
