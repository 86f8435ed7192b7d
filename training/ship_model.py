"""Assembles the shipped checkpoint folder from a training run's output.

    python -m training.ship_model .cache/pycode-data RUN_OUT models/nemotron-h-pycode

writes config.json (from train_pycode.pycode_config, with ``architectures``), the tokenizer,
the weights, the training log and loss plot, the held-out text and the data manifest.
The model card (README.md) is written by hand from those.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sysconfig
from pathlib import Path

from training.train_pycode import PYCODE_PRESET, pycode_config


def write_config(dst: Path) -> None:
    config = pycode_config()
    config.save_pretrained(str(dst))
    cfg = json.loads((dst / "config.json").read_text())
    # transformers >= 5.19 writes the layer list only; older releases (and vLLM 0.26 on
    # them) read the pattern string. Both describe the same layers.
    cfg["hybrid_override_pattern"] = PYCODE_PRESET["hybrid_override_pattern"]
    cfg["architectures"] = ["NemotronHForCausalLM"]
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("run", type=Path)
    ap.add_argument("dst", type=Path)
    args = ap.parse_args()
    args.dst.mkdir(parents=True, exist_ok=True)
    write_config(args.dst)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(args.data / "tokenizer" / name, args.dst / name)
    shutil.copy(args.data / "heldout.txt.gz", args.dst / "heldout.txt.gz")
    shutil.copy(args.data / "manifest.json", args.dst / "data_manifest.json")
    shutil.copy(
        Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt", args.dst / "DATA_LICENSE.txt"
    )
    for name in ("model.safetensors", "train_log.json", "loss.png"):
        shutil.copy(args.run / name, args.dst / name)


if __name__ == "__main__":
    main()
