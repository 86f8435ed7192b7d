"""Checkpoints the project makes itself: no weights can be downloaded.

* ``write_tiny_checkpoint`` builds a small random-weight Nemotron-H checkpoint in HF format
  (safetensors, ``config.json`` with ``architectures``) with a trained byte-level BPE
  tokenizer and a chat template beside it. Tests and ``make demo`` run on these.
* ``write_real_shape_config`` writes only the ``config.json`` of a public Nemotron-H model,
  for full-size runs with ``load_format="dummy"`` (random weights, real shapes).
* ``write_published_config`` writes a public model's ``config.json`` in the schema of the
  files on the model cards (transformers 4.x: a ``hybrid_override_pattern`` string and
  ``num_hidden_layers``), where ``write_real_shape_config`` writes transformers 5's
  (``layers_block_type`` lists).
* ``write_fp8_checkpoint`` makes an FP8 copy of a checkpoint in the compressed-tensors
  format that published FP8 checkpoints use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# A preset's shape: one row of values in the order of SHAPE_FIELDS, and for a model with MoE
# layers one row in the order of MOE_FIELDS (preset() adds the fields all of them share).
SHAPE_FIELDS = (
    "hybrid_override_pattern", "hidden_size", "mamba_num_heads", "mamba_head_dim",
    "ssm_state_size", "n_groups", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size",
)  # fmt: skip
MOE_FIELDS = (
    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
    "moe_shared_expert_intermediate_size", "routed_scaling_factor",
)  # fmt: skip


def preset(shape: tuple, moe: tuple = ()) -> dict[str, Any]:
    """The config fields of a row of SHAPE_FIELDS values and, when given, a row of
    MOE_FIELDS values (with one shared expert, one routing group, normalised top-k)."""
    fields = dict(zip(SHAPE_FIELDS, shape, strict=True))
    if moe:
        fields.update(zip(MOE_FIELDS, moe, strict=True))
        fields.update(n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True)
    return fields


# Nemotron-H 8B's 52 layers (24 Mamba2, 24 MLP, 4 attention)
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"

# Small configs covering the family: Mamba2 (M), attention (*), MLP (-) and MoE (E) layers,
# with different d_state, head_dim (80: not a power of two) and n_groups.
TINY_PRESETS: dict[str, dict[str, Any]] = {
    # pattern, hidden, Mamba heads, head_dim, d_state, groups, attention heads, KV heads,
    # attention head_dim, MLP size; MoE: experts, per token, size, shared size, scaling
    "dense": preset(("M*M-M-", 256, 8, 32, 64, 2, 4, 2, 64, 512)),
    "dense-h80": preset(("MM*-M-", 320, 8, 80, 16, 4, 4, 2, 80, 640)),
    "dense-g1": preset(("M-*M-", 256, 8, 32, 32, 1, 4, 2, 64, 512)),
    # "dense" with two attention layers: vLLM then groups the Mamba layers two to a KV-cache
    # group (with one attention layer each Mamba layer has a group of its own), so the layers
    # of a group share one step's slots
    "dense-grouped": preset(("M*M-M*M-", 256, 8, 32, 64, 2, 4, 2, 64, 512)),
    "moe": preset(("MEM*EM", 256, 8, 64, 128, 8, 4, 2, 64, 512), (8, 2, 128, 256, 2.5)),
    # latent MoE (Nemotron 3 Super's): the routed experts work in a 64-wide projection
    "moe-latent": dict(
        preset(("MEM*EM", 256, 8, 64, 128, 8, 4, 2, 64, 512), (8, 2, 128, 256, 2.5)),
        moe_latent_size=64,
    ),
    # the 8B's layers (and so its KV-cache groups) at "dense"'s widths: with CUDA graphs a
    # decode step's time is the host's, which this makes visible (step_profile.py --host)
    "layout-8b": preset((NEMOTRON_H_8B_PATTERN, 256, 8, 32, 64, 2, 4, 2, 64, 512)),
    # "dense" with one MTP layer (vLLM's nemotron_h_mtp drafts with it): an attention layer,
    # since vLLM's CPU MoE cannot run the published "*E" pattern's relu2 experts
    "dense-mtp": dict(
        preset(("M*M-M-", 256, 8, 32, 64, 2, 4, 2, 64, 512)),
        num_nextn_predict_layers=1,
        mtp_hybrid_override_pattern="*",
    ),
}

# Nemotron 3 Super's 88 layers (40 Mamba2, 40 MoE, 8 attention)
NEMOTRON_3_SUPER_PATTERN = (
    "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
)

# Public configs (as collected in shared/environment.md) for real-shape runs.
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "nemotron-h-8b": preset(
        (
            NEMOTRON_H_8B_PATTERN,
            4096,
            128,
            64,
            128,
            8,
            32,
            8,
            128,
            21504,
        )
    ),  # fmt: skip
    "nano-9b-v2": preset(
        (
            "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
            4480,
            128,
            80,
            128,
            8,
            40,
            8,
            128,
            15680,
        )
    ),  # fmt: skip
    # n_groups: the model card lists no Mamba group count; 8 as the 9B distilled from it
    "nano-12b-v2": preset(
        (
            "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-",
            5120,
            128,
            80,
            128,
            8,
            40,
            8,
            128,
            20480,
        )
    ),  # fmt: skip
    "nano-v3-30b": preset(
        (
            "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
            2688,
            64,
            64,
            128,
            8,
            32,
            2,
            128,
            1856,
        ),
        (128, 6, 1856, 3712, 2.5),
    ),  # fmt: skip
    # Nemotron 3 Super: NVIDIA's Megatron-Bridge model provider (Nemotron3SuperProvider; no
    # config.json is public): latent MoE, two MTP layers of pattern "*E", vocabulary as in
    # the family. ~120 B parameters: config-only in tests, real-shape runs need TP >= 4
    "nemotron-3-super": dict(
        preset(
            (NEMOTRON_3_SUPER_PATTERN, 4096, 128, 64, 128, 8, 32, 2, 128, 2688),
            (512, 22, 2688, 5376, 5.0),
        ),
        moe_latent_size=1024,
        num_nextn_predict_layers=2,
        mtp_hybrid_override_pattern="*E",
    ),
}

_COMMON: dict[str, Any] = dict(
    conv_kernel=4,
    use_conv_bias=True,
    mamba_hidden_act="silu",
    mlp_hidden_act="relu2",
    layer_norm_epsilon=1e-5,
    chunk_size=128,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    mamba_ssm_cache_dtype="float32",
    residual_in_fp32=False,
)

TINY_VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
# Text the tokenizer is trained on: enough variety for a few hundred merges.
_CORPUS = (
    """
The quick brown fox jumps over the lazy dog. A state space model carries the history of
a sequence in a fixed-size state. Mamba layers update that state one token at a time during
decoding, while attention layers read every earlier key and value. Hybrid models mix both.
The weather today is sunny with a light breeze from the west. Tomorrow it may rain.
Once upon a time there was a small robot who wanted to learn how to paint the sea.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Questions? Answers! Lists: apples, pears, plums.
def add(a, b): return a + b  # Python code is text too.
The history of the city begins with a river, a bridge and a market on the eastern bank.
Serving a language model means batching many requests and streaming tokens back quickly.
"""
    * 4
)


def _train_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))


def make_config(preset: dict[str, Any], vocab_size: int, dtype: str):
    """A transformers ``NemotronHConfig`` from a preset plus the fields all share."""
    from transformers import NemotronHConfig

    fields = {**_COMMON, **preset, "vocab_size": vocab_size}
    config = NemotronHConfig(**fields)
    config.architectures = ["NemotronHForCausalLM"]
    config.dtype = dtype
    return config


def write_tiny_checkpoint(
    path: str | Path, preset: str = "dense", seed: int = 0, dtype: str = "float32"
) -> Path:
    """Writes a random-weight checkpoint with tokenizer to ``path`` (once) and returns it.

    Weights are drawn large enough (std 0.5 / sqrt(fan_in) for projections, larger
    embeddings) that greedy decoding changes its argmax from position to position. A preset
    with MTP layers also gets their weights (``_mtp_layer_weights``).
    """
    import torch
    from transformers import NemotronHForCausalLM

    if preset not in TINY_PRESETS:
        raise ValueError(f"preset must be one of {sorted(TINY_PRESETS)}, got {preset!r}")
    path = Path(path)
    if (path / "model.safetensors").exists() and (path / "tokenizer.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    config = make_config(TINY_PRESETS[preset], TINY_VOCAB_SIZE, dtype)
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("A_log", "dt_bias", ".D")) or "norm" in name:
                continue
            if param.dim() >= 2:
                fan_in = param.shape[-1]
                std = 1.0 if "embed" in name else 1.5 / fan_in**0.5
                param.normal_(0.0, std)
            elif "bias" in name:
                param.normal_(0.0, 0.1)
        # transformers clamps softplus(dt + dt_bias) from below at time_step_min (0.001), vLLM
        # at 0: keep dt well above 0.001 so that both compute the same function.
        heads = config.mamba_num_heads
        for name, param in model.named_parameters():
            if name.endswith("mixer.dt_bias"):
                param.copy_(torch.expm1(torch.empty(heads).uniform_(0.01, 0.1)).log())
            elif name.endswith("mixer.in_proj.weight"):
                param[-heads:].normal_(0.0, 0.5 / param.shape[1] ** 0.5)
        for name, buf in model.named_buffers():
            if name.endswith("gate.e_score_correction_bias"):
                buf.normal_(0.0, 0.1)
        if config.num_nextn_predict_layers:  # the MTP layer drafts through this LM head
            model.lm_head.weight.copy_(model.get_input_embeddings().weight)
    model.generation_config.eos_token_id = None
    model.to(getattr(torch, dtype)).save_pretrained(str(path))
    if config.num_nextn_predict_layers:
        _add_tensors(path / "model.safetensors", _mtp_layer_weights(config, getattr(torch, dtype)))
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["NemotronHForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    _train_tokenizer(path)
    return path


def write_echo_draft_model(path: str | Path, seed: int = 0) -> Path:
    """Writes (once) a one-layer Llama draft model for the tiny checkpoints (their vocabulary
    and tokenizer) that mostly proposes the token it is given: its layer adds nothing to the
    residual and its LM head is its embedding. The tiny models often repeat a token, so its
    drafts are accepted and rejected."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if (path / "model.safetensors").exists() and (path / "tokenizer.json").exists():
        return path
    config = LlamaConfig(
        vocab_size=TINY_VOCAB_SIZE, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    llama = LlamaForCausalLM(config)
    with torch.no_grad():
        llama.model.layers[0].self_attn.o_proj.weight.zero_()
        llama.model.layers[0].mlp.down_proj.weight.zero_()
    llama.save_pretrained(str(path))
    _train_tokenizer(path)
    return path


def _mtp_layer_weights(config, dtype) -> dict[str, Any]:
    """Weights of one attention MTP layer (the names vLLM's nemotron_h_mtp loads) that
    mostly drafts the token it is given: its fusion passes the token's embedding on (plus a
    little of the target's hidden state), its attention adds a little, and the checkpoint's
    LM head holds the embedding matrix, whose row of a token scores that token highest. So
    drafts are accepted where the model repeats a token, which these random models do, and
    rejected elsewhere."""
    import torch

    if config.mtp_hybrid_override_pattern != "*":
        raise ValueError(
            f"mtp_hybrid_override_pattern must be '*' here (one attention layer), got "
            f"{config.mtp_hybrid_override_pattern!r}"
        )
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_heads, head_dim = config.num_key_value_heads, config.head_dim

    def small(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols) * 0.1 / cols**0.5

    layer = "mtp.layers.0."
    weights = {
        "enorm.weight": torch.ones(hidden),
        "hnorm.weight": torch.ones(hidden),
        "eh_proj.weight": torch.cat([torch.eye(hidden), small(hidden, hidden)], dim=1),
        "norm.weight": torch.ones(hidden),
        "mixer.q_proj.weight": torch.randn(heads * head_dim, hidden) / hidden**0.5,
        "mixer.k_proj.weight": torch.randn(kv_heads * head_dim, hidden) / hidden**0.5,
        "mixer.v_proj.weight": torch.randn(kv_heads * head_dim, hidden) / hidden**0.5,
        "mixer.o_proj.weight": small(hidden, heads * head_dim),
        "final_layernorm.weight": torch.ones(hidden),
    }
    return {layer + name: w.to(dtype) for name, w in weights.items()}


def _add_tensors(file: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import load_file, save_file

    save_file({**load_file(str(file)), **tensors}, str(file), metadata={"format": "pt"})


def write_real_shape_config(path: str | Path, model: str, dtype: str = "bfloat16") -> Path:
    """Writes ``config.json`` and a tokenizer for a public model's shapes (no weights)."""
    if model not in REAL_SHAPES:
        raise ValueError(f"model must be one of {sorted(REAL_SHAPES)}, got {model!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = make_config(REAL_SHAPES[model], 131072, dtype)
    config.save_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["NemotronHForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    if not (path / "tokenizer.json").exists():
        _train_tokenizer(path)
    return path


def write_published_config(
    path: str | Path, model: str, tokenizer: bool = False, **changes: Any
) -> Path:
    """Writes ``config.json`` of public model ``model`` (REAL_SHAPES) as its model card
    publishes it (no weights), with ``changes`` applied (e.g. the fields of a newer family
    member: ``moe_latent_size``, MTP layers, per-layer ``intermediate_size``); with
    ``tokenizer`` also a small tokenizer, for an engine with random weights to serve it."""
    if model not in REAL_SHAPES:
        raise ValueError(f"model must be one of {sorted(REAL_SHAPES)}, got {model!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fields = {**_COMMON, **REAL_SHAPES[model]}
    cfg = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "num_hidden_layers": len(fields["hybrid_override_pattern"]),
        "vocab_size": 131072,
        "torch_dtype": "bfloat16",
        "expand": 2,
        "rms_norm_eps": fields["layer_norm_epsilon"],
        "attention_bias": False,
        "mlp_bias": False,
        "use_bias": False,
        "mamba_proj_bias": False,
        **fields,
        **changes,
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    if tokenizer and not (path / "tokenizer.json").exists():
        _train_tokenizer(path)
    return path


# float8_e4m3fn's largest finite value
FP8_E4M3_MAX = 448.0
# llm-compressor's FP8_DYNAMIC scheme: weights one scale per output channel, activations one
# per token at run time.
FP8_DYNAMIC_SCHEME = {
    "targets": ["Linear"],
    "weights": {
        "num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
        "dynamic": False,
    },
    "input_activations": {
        "num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True,
    },
    "output_activations": None,
}  # fmt: skip


def is_fp8_projection(name: str) -> bool:
    """The weights an FP8 checkpoint quantizes: the linear projections (Mamba in/out,
    attention, MLP, routed and shared experts); not the embeddings, norms, conv, router or
    LM head."""
    return name.endswith("_proj.weight")


def write_fp8_checkpoint(src: str | Path, dst: str | Path, keep: tuple[str, ...] = ()) -> Path:
    """Writes an FP8 copy of checkpoint ``src`` to ``dst`` (once) and returns it: each
    projection weight (is_fp8_projection) as float8_e4m3fn with an fp32 ``weight_scale`` per
    output channel (the row's max |w| / 448, round to nearest), described by a
    compressed-tensors ``quantization_config`` (FP8_DYNAMIC_SCHEME). Projections whose
    module name ends with one of ``keep`` (e.g. "in_proj") stay as they are and are listed
    in its ``ignore`` with the LM head, as published checkpoints list layers kept in 16 bits.
    The other tensors and files are copied as they are."""
    import re
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    if (dst / "model.safetensors").exists():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    out = {}
    kept = sorted(
        name.removesuffix(".weight")
        for name in tensors
        if is_fp8_projection(name) and name.removesuffix(".weight").endswith(keep or ("\0",))
    )
    for name, weight in tensors.items():
        if not is_fp8_projection(name) or name.removesuffix(".weight") in kept:
            out[name] = weight
            continue
        w = weight.float()
        scale = w.abs().amax(dim=1, keepdim=True) / FP8_E4M3_MAX
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row
        out[name] = (w / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
        out[name.removesuffix("weight") + "weight_scale"] = scale
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for file in src.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name != "config.json":
            shutil.copy(file, dst / file.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": FP8_DYNAMIC_SCHEME},
        # patterns, not names: vLLM renames the modules (backbone. -> model.)
        "ignore": ["lm_head", *(f"re:.*\\.{re.escape(k)}$" for k in keep)],
        "kv_cache_scheme": None,
    }
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst
