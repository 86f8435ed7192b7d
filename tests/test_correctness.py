"""Greedy tokens through vllm.LLM with the plugin equal transformers' NemotronHForCausalLM.

fp32, prompts of different lengths in one batch, 32 new tokens, chunked prefill with a small
token budget so that prefill chunks and decode rows share steps. Then batch invariance and
state-slot reuse through an engine with max_num_seqs=4.
"""

from __future__ import annotations

import random

import pytest

from tests.engines import run_engine
from tests.reference import hf_greedy

pytestmark = pytest.mark.engine

TEXTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a small robot who wanted to learn how to paint the sea, "
    "so it went to the market on the eastern bank of the river.",
    "Serving a language model means batching many requests and streaming tokens back quickly. "
    "A state space model carries the history of a sequence in a fixed-size state. " * 3,
]
NEW = 32
ENGINE = dict(
    dtype="float32",
    max_model_len=512,
    gpu_memory_utilization=0.1,
    enable_chunked_prefill=True,
    max_num_batched_tokens=48,
    enforce_eager=True,
)


def encode(model_dir: str, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tok(t).input_ids for t in texts]


@pytest.mark.parametrize("preset", ["dense-h80", "moe", "moe-latent"])
def test_greedy_tokens_equal_transformers(tiny_checkpoint, preset):
    model = tiny_checkpoint(preset)
    prompts = encode(model, TEXTS)
    assert len({len(p) for p in prompts}) == len(prompts)
    got = run_engine(dict(model=model, prompts=prompts, max_tokens=NEW, engine=ENGINE))
    assert got["model_class"].startswith("vllm_nemotron_h.")
    ref = hf_greedy(model, prompts, NEW)
    assert got["tokens"] == ref
    assert all(len(set(t)) > 8 for t in ref), "weights too small: the argmax barely changes"


def random_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 60))] for _ in range(n)]


# Prompts of one token: they join steps in which other sequences decode and take slots that
# earlier sequences left (the plugin runs such a row as a decode from a zeroed slot).
ONE_TOKEN = [[1], [5], [260]]


def test_batch_invariance_and_slot_reuse(tiny_checkpoint):
    # several Mamba layers to a KV-cache group: each reads the step's slots of its group
    model = tiny_checkpoint("dense-grouped")
    probe = encode(model, TEXTS[2:3])
    others = random_prompts(16, seed=1)
    many = random_prompts(50, seed=2)
    res = run_engine(
        dict(
            model=model,
            prompts=probe,
            max_tokens=24,
            engine=dict(ENGINE, max_num_seqs=4),
            jobs=[probe + others + ONE_TOKEN, many] + [[p] for p in many],
        )
    )
    alone, in_batch, together = res["tokens"][0], res["jobs"][0][0], res["jobs"][1]
    assert in_batch == alone, "a prompt must decode the same alone and in a batch of 17"
    singles = [job[0] for job in res["jobs"][2:]]
    # 50 requests through 4 slots: every slot is reused many times.
    assert together == singles
    one_token = res["jobs"][0][-len(ONE_TOKEN) :]
    assert one_token == hf_greedy(model, ONE_TOKEN, 24), "one-token prompts in reused slots"


def test_prefix_cache_hits_give_reference_tokens(tiny_checkpoint):
    """vLLM 0.32 turns prefix caching on for hybrid models ("align" Mamba cache mode): a
    prompt that extends an earlier one starts from cached states and must still decode as
    transformers does."""
    model = tiny_checkpoint("dense")
    rng = random.Random(3)
    base = [1] + [rng.randrange(3, 500) for _ in range(300)]
    longer = base + [rng.randrange(3, 500) for _ in range(37)]
    res = run_engine(
        dict(
            model=model,
            prompts=[base],
            max_tokens=16,
            engine=dict(
                ENGINE, enable_prefix_caching=True, block_size=64, max_num_batched_tokens=512
            ),
            jobs=[[longer], [base]],
        )
    )
    ref = hf_greedy(model, [base, longer], 16)
    assert [job[0] for job in res["cached_tokens"][1:]] == [256, 256], res["cached_tokens"]
    assert res["tokens"][0] == ref[0]
    assert res["jobs"][0][0] == ref[1], "after a prefix-cache hit"
    assert res["jobs"][1][0] == ref[0], "the same prompt again (full hit)"
