"""The OpenAI-compatible server with the plugin (loaded through its entry point only), driven
by the `openai` client: completions and chat completions, streamed and not, equal to the
offline LLM's greedy results for the same prompts."""

from __future__ import annotations

import pytest

from tests.engines import TINY_ENGINE, run_engine

pytestmark = pytest.mark.engine

PROMPTS = ["The history of the city", "Hello there, how are", "A state space model"]
CHAT = [{"role": "user", "content": "Tell me about the sea."}]
NEW = 16


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.fixture(scope="module")
def offline(server):
    from transformers import AutoTokenizer

    model, _ = server
    chat_prompt = AutoTokenizer.from_pretrained(model).apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=False
    )
    res = run_engine(
        dict(
            model=model,
            prompts=[[1]],
            max_tokens=NEW,
            engine=TINY_ENGINE,
            text_prompts=PROMPTS + [chat_prompt],
        )
    )
    return res["texts"]


def test_completions_equal_offline(server, offline):
    from openai import OpenAI

    model, url = server
    client = OpenAI(base_url=url + "/v1", api_key="unused")
    for prompt, want in zip(PROMPTS, offline):
        got = client.completions.create(model=model, prompt=prompt, max_tokens=NEW, temperature=0)
        assert got.choices[0].text == want
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(
                model=model, prompt=prompt, max_tokens=NEW, temperature=0, stream=True
            )
        )
        assert streamed == want


def test_chat_completions_equal_offline(server, offline):
    from openai import OpenAI

    model, url = server
    client = OpenAI(base_url=url + "/v1", api_key="unused")
    want = offline[-1]
    got = client.chat.completions.create(model=model, messages=CHAT, max_tokens=NEW, temperature=0)
    assert got.choices[0].message.content == want
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=NEW, temperature=0, stream=True
        )
    )
    assert streamed == want


def test_serve_script_starts_with_vllm_defaults(tiny_checkpoint):
    """examples/serve.sh (what `make serve` runs) with no engine flags at all, only an address:
    vLLM's own defaults must start on this machine (on CPU the script caps the memory share
    that vLLM's default would ask of one NUMA node) and answer a completion."""
    import requests

    from tests.server import openai_server

    model = tiny_checkpoint("dense")
    with openai_server(model, log_name="serve-defaults.log", tiny_flags=False, timeout=600) as url:
        reply = requests.post(
            url + "/v1/completions",
            json=dict(model=model, prompt=PROMPTS[0], max_tokens=4, temperature=0.0),
            timeout=120,
        ).json()
    assert reply["usage"]["completion_tokens"] == 4


def test_engine_log_says_what_runs(server):
    """The server's log names the plugin, its version and what runs, once per engine process
    (the model is built in the engine core process only)."""
    from tests.server import ROOT

    log = (ROOT / ".cache" / "tiny-server.log").read_text()
    lines = [line for line in log.splitlines() if "serves NemotronHForCausalLM" in line]
    assert len(lines) == 1, lines
    assert "vllm-nemotron-h " in lines[0] and "INFO" in lines[0]
    import torch

    from vllm_nemotron_h.vllm_boundary.cpu_ops import has_native_decode_ops

    if torch.cuda.is_available():
        decode_path = "the plugin's Triton kernels"
    elif has_native_decode_ops():
        decode_path = "vLLM's native CPU conv and state-update ops"
    else:
        decode_path = "the plugin's CPU path"
    assert f"Mamba2 decode on {decode_path}" in lines[0], lines[0]
    assert "SSM state float32" in lines[0], lines[0]
