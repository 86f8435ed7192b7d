"""Greedy generation with transformers' NemotronHForCausalLM: the reference implementation."""

from __future__ import annotations

import torch

from training.train_pycode import unclamp_dt


def hf_model(model_dir: str, device: str = "cpu"):
    """transformers' model in fp32, computing what vLLM computes: no lower clamp of dt."""
    from transformers import NemotronHForCausalLM

    model = NemotronHForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    unclamp_dt(model)
    return model


def hf_greedy(
    model_dir: str, prompts: list[list[int]], max_new_tokens: int, device: str = "cpu"
) -> list[list[int]]:
    model = hf_model(model_dir, device)
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            gen = model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs
