"""The plugin's lines in the engine's log. vLLM's logging configuration puts a handler on its
``vllm`` logger only (not propagating to the root), so a logger outside that namespace says
nothing in a vLLM process at INFO; the plugin logs as a child of it."""

from __future__ import annotations

import logging

LOGGER_NAME = "vllm.vllm_nemotron_h"


def plugin_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)
