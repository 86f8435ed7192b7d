"""The plugin in vLLM on a GPU (vLLM 0.26 on the H100): reference tokens, the built-in model,
CUDA graphs, and which kernels one decode step runs. Skipped without a GPU."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.engines import run_engine
from tests.reference import hf_greedy
from vllm_nemotron_h.checkpoints import write_tiny_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROMPTS = [
    [1, 17, 301, 44, 9, 250, 77, 12, 5, 98, 411, 3],
    [1, 400, 23],
    [1],  # a one-token prompt (has broken full-graph decode capture before)
    [1, 88, 91, 17, 260, 33, 470, 12],
]
NEW = 32
ENGINE = dict(
    max_model_len=512,
    gpu_memory_utilization=0.3,
    enable_chunked_prefill=True,
    max_num_batched_tokens=16,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "dense-h80", "dense-h80"))


@pytest.fixture(scope="module")
def reference(checkpoint):
    return hf_greedy(checkpoint, PROMPTS, NEW, device="cuda")


def test_fp32_eager_and_graphs_match_transformers_and_builtin(checkpoint, reference):
    spec = dict(
        model=checkpoint,
        prompts=PROMPTS,
        max_tokens=NEW,
        engine=dict(ENGINE, dtype="float32", enforce_eager=True),
    )
    eager = run_engine(dict(spec, profile=True), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    # CUDA graphs with more requests (4) than decode slots captured per graph (max_num_seqs=2).
    graphs = run_engine(
        dict(
            spec,
            engine=dict(
                ENGINE,
                dtype="float32",
                max_num_seqs=2,
                compilation_config={"cudagraph_capture_sizes": [1, 2]},
            ),
        )
    )
    builtin = run_engine(spec, VLLM_NEMOTRON_H_DISABLE="1")
    assert eager["model_class"].startswith("vllm_nemotron_h.")
    assert graphs["model_class"].startswith("vllm_nemotron_h.")
    assert builtin["model_class"] == "vllm.model_executor.models.nemotron_h.NemotronHForCausalLM"
    # vLLM's Triton prefill kernels take fp32 dots in TF32, so on a GPU vLLM (built-in as well)
    # may leave transformers' path at a near-tie; the plugin must equal the built-in exactly
    # and transformers wherever the built-in does.
    assert eager["tokens"] == builtin["tokens"]
    assert graphs["tokens"] == eager["tokens"]
    agree = [
        next((i for i, (a, b) in enumerate(zip(t, r)) if a != b), len(r))
        for t, r in zip(builtin["tokens"], reference)
    ]
    print("tokens equal to transformers before the first difference, per prompt:", agree)
    assert sum(a == NEW for a in agree) >= len(PROMPTS) - 1
    kernels = [row[0] for row in eager["profile"]]
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "decode-profile.json"), "w") as f:
            json.dump(eager["profile"], f, indent=1)
    for ours in (
        "_selective_state_update_kernel",
        "_causal_conv1d_update_kernel",
        "_group_rms_norm_kernel",
        "_rms_norm_kernel",
    ):
        assert any(ours in k for k in kernels), f"{ours} did not run: {kernels}"
    assert not any("_selective_scan_update_kernel" in k for k in kernels)


def test_bf16_logprobs_close_to_builtin(checkpoint):
    spec = dict(
        model=checkpoint,
        prompts=PROMPTS,
        max_tokens=NEW,
        logprobs=True,
        engine=dict(ENGINE, dtype="bfloat16", enforce_eager=True),
    )
    ours = run_engine(spec)
    builtin = run_engine(spec, VLLM_NEMOTRON_H_DISABLE="1")
    # Compare the logprobs each assigned to the tokens both generated, up to the first split.
    diffs = []
    for t_o, t_b, l_o, l_b in zip(
        ours["tokens"], builtin["tokens"], ours["logprobs"], builtin["logprobs"]
    ):
        for a, b, x, y in zip(t_o, t_b, l_o, l_b):
            if a != b:
                break
            diffs.append(abs(x - y))
    mean = sum(diffs) / len(diffs)
    print(f"bf16 mean |logprob difference| over {len(diffs)} tokens: {mean:.5f}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bf16-logprob-diff.json"), "w") as f:
            json.dump(dict(mean_abs_diff=mean, tokens=len(diffs)), f)
    assert len(diffs) >= 32
    assert mean <= 1e-2
