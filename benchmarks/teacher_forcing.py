"""Teacher forcing through vLLM's decode path: each step's token is the text's next token.

A logits processor leaves only the request's next forced token sampleable; vLLM's logprobs
(``logprobs_mode="raw_logprobs"``, its default) are computed from the model's logits before
any processor runs, so each step returns log p(text token | text so far) from a real decode
step: the SSM state is read and written in its cache format at every token, as when the
model generates. Prompt logprobs cannot show a state format: a prompt that fits one prefill
chunk never stores its state between tokens.

    LLM(..., logits_processors=[ForcedTokens])
    SamplingParams(max_tokens=n, logprobs=0, extra_args={FORCED_TOKENS: tokens[1:]})
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

FORCED_TOKENS = "forced_tokens"


class ForcedTokens(AdapterLogitsProcessor):
    """Per request: ``extra_args["forced_tokens"][i]`` is the only token step ``i`` may take."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        forced = (params.extra_args or {}).get(FORCED_TOKENS)
        if forced is None:
            return None

        def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            target = forced[len(output_ids)]
            keep = logits[target].clone()
            logits.fill_(float("-inf"))
            logits[target] = keep
            return logits

        return force
