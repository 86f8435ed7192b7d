"""Offline batch generation with vLLM's LLM API and the plugin: JSONL in, JSONL out.

Each input line is {"id": ..., "prompt": "..."}; each output line is {"id", "prompt", "text",
"prompt_tokens", "completion_tokens"}. Outputs are appended chunk by chunk; a rerun skips the
ids already written, so an interrupted job loses at most the chunk in flight.

    python examples/offline_batch.py --model CHECKPOINT --input prompts.jsonl --output out.jsonl
    python examples/offline_batch.py --demo     # the shipped model, a few prompts (make demo)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_DIR = ROOT / ".cache" / "demo"
# The model that ships with the project: a small Nemotron-H trained on Python's standard
# library (models/nemotron-h-pycode/README.md).
DEMO_MODEL = ROOT / "models" / "nemotron-h-pycode"
DEMO_PROMPTS = [
    'def is_palindrome(text):\n    """Return True if',
    "    def __len__(self):\n        return",
    'import os\n\n\ndef list_python_files(root):\n    """Return',
    "    def __repr__(self):\n        return",
]


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not valid JSON ({e.msg})") from e
    return rows


def pending(inputs: list[dict], output: Path) -> list[dict]:
    for n, row in enumerate(inputs, 1):
        if "id" not in row or not isinstance(row.get("prompt"), str):
            raise SystemExit(f'input line {n}: needs an "id" and a string "prompt", got {row}')
    done = {row["id"] for row in read_jsonl(output)}
    return [row for row in inputs if row["id"] not in done]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", help="checkpoint folder or name (default with --demo: the shipped model)"
    )
    ap.add_argument("--input", type=Path, help="JSONL file of {id, prompt}")
    ap.add_argument("--output", type=Path, help="JSONL file the results are appended to")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--chunk", type=int, default=64, help="prompts per generate call")
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--engine-args", default="{}", help="JSON of extra vllm.LLM arguments")
    args = ap.parse_args()

    engine = json.loads(args.engine_args)
    if args.demo:
        args.model = args.model or str(DEMO_MODEL)
        DEMO_DIR.mkdir(parents=True, exist_ok=True)
        args.input = args.input or DEMO_DIR / "prompts.jsonl"
        args.output = args.output or DEMO_DIR / "outputs.jsonl"
        if args.input == DEMO_DIR / "prompts.jsonl":
            args.input.write_text(
                "".join(
                    json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(DEMO_PROMPTS)
                )
            )
        if args.output.exists():
            args.output.unlink()  # the demo starts over each time
        engine = {
            "dtype": "float32",
            "max_model_len": 1024,
            "gpu_memory_utilization": 0.2,
            **engine,
        }
    if not (args.model and args.input and args.output):
        ap.error("--model, --input and --output are required (or use --demo)")

    todo = pending(read_jsonl(args.input), args.output)
    print(f"{len(todo)} prompts to run ({args.output} holds the rest)")
    if not todo:
        return

    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # for apply_model below
    from vllm import LLM, SamplingParams

    from vllm_nemotron_h.testing import model_class_name

    llm = LLM(model=args.model, **engine)
    logging.getLogger("vllm_nemotron_h").warning(
        "model class running: %s", llm.apply_model(model_class_name)[0]
    )
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    with args.output.open("a") as out:
        for start in range(0, len(todo), args.chunk):
            chunk = todo[start : start + args.chunk]
            results = llm.generate([r["prompt"] for r in chunk], params)
            for row, res in zip(chunk, results):
                out.write(
                    json.dumps(
                        {
                            "id": row["id"],
                            "prompt": row["prompt"],
                            "text": res.outputs[0].text,
                            "prompt_tokens": len(res.prompt_token_ids),
                            "completion_tokens": len(res.outputs[0].token_ids),
                        }
                    )
                    + "\n"
                )
            out.flush()
    if args.demo:
        for row in read_jsonl(args.output):
            # The continuation in bold on a terminal, after a "|" elsewhere.
            on, off = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("|", "")
            print(f"--- [{row['id']}]\n{row['prompt']}{on}{row['text']}{off}")


if __name__ == "__main__":
    main()
