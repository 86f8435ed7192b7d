"""What the tests, benchmarks and training build on: checkpoints the project makes, model
shapes, input layouts. The plugin never imports this package (a test checks it)."""

from __future__ import annotations


def model_class_name(model: object) -> str:
    """``module.Class`` of a model; ``LLM.apply_model(model_class_name)`` asks a running
    engine which implementation it built."""
    return f"{type(model).__module__}.{type(model).__qualname__}"


def device_tag(device_name: str) -> str:
    """A results file's device suffix from a device's name: "h100", "h200", "cpu"."""
    return "h100" if "H100" in device_name else device_name.split()[-1].lower()
