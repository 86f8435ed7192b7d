"""What the tests, benchmarks and training build on: checkpoints the project makes, model
shapes, input layouts. The plugin never imports this package (a test checks it)."""

from __future__ import annotations


def model_class_name(model: object) -> str:
    """``module.Class`` of a model; ``LLM.apply_model(model_class_name)`` asks a running
    engine which implementation it built."""
    return f"{type(model).__module__}.{type(model).__qualname__}"
