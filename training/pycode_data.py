"""The training and held-out text of the shipped model: Python's standard library source.

Every machine that runs the project has it (CPython 3.11's ``Lib/``, PSF License), so the
data list is fixed by the rules below plus each file's SHA-256 in the manifest. Files are
split by a hash of their path: about 1 in 20 is held out, whole.

    python -m training.pycode_data OUT_DIR       # manifest, tokenizer, token arrays, held-out text

writes into OUT_DIR:
    manifest.json           files (path, bytes, sha256, split) and the rules that chose them
    tokenizer/              byte-level BPE trained on the training split (tokenizers)
    train.bin, heldout.bin  token ids (uint16), each file as <s> tokens </s>
    heldout.txt.gz          the held-out files' text, joined by the same separator
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
BOS_ID, EOS_ID = 1, 2
HELDOUT_ONE_IN = 20
# Directories of tests and vendored or generated code: not what a user writes.
EXCLUDED_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "_bundled"}
# Separator between files in the held-out text (one line of its own).
FILE_SEPARATOR = "\n# ---- end of file ----\n"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[Path]:
    """The standard library's .py files outside tests and vendored code, sorted by path."""
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_PARTS.isdisjoint(rel.parts[:-1]) and not rel.parts[0].startswith(
            ("test", "config-")
        ):
            files.append(path)
    return files


def split_of(rel_path: str) -> str:
    digest = hashlib.sha256(rel_path.encode()).digest()
    return "heldout" if int.from_bytes(digest[:4], "little") % HELDOUT_ONE_IN == 0 else "train"


def train_tokenizer(texts: list[str], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Each training document starts with <s>: so does every encoded prompt.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(str(out))


def encode_documents(tokenizer_dir: Path, texts: list[str]):
    """One uint16 array: each text as <s> tokens </s>."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids += [BOS_ID, *enc.ids, EOS_ID]
    return np.asarray(ids, dtype=np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    root = stdlib_dir()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    rows, texts = [], {"train": [], "heldout": []}
    for path in source_files(root):
        rel = path.relative_to(root).as_posix()
        raw = path.read_bytes()
        text = raw.decode("utf-8", errors="replace")
        split = split_of(rel)
        texts[split].append(text)
        rows.append(
            dict(path=rel, bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest(), split=split)
        )
    manifest = dict(
        source=f"CPython {sys.version.split()[0]} standard library ({root})",
        license="PSF License Agreement (Python Software Foundation License Version 2)",
        rules=dict(
            glob="**/*.py",
            excluded_directories=sorted(EXCLUDED_PARTS),
            excluded_top_level_prefixes=["test", "config-"],
            heldout="sha256(relative path)[:4] as little-endian int % 20 == 0",
        ),
        files=rows,
    )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    train_tokenizer(texts["train"], out / "tokenizer")
    for split, docs in texts.items():
        encode_documents(out / "tokenizer", docs).tofile(out / f"{split}.bin")
    with gzip.open(out / "heldout.txt.gz", "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(FILE_SEPARATOR.join(texts["heldout"]))
    for split in texts:
        n_bytes = sum(r["bytes"] for r in rows if r["split"] == split)
        n_tok = (out / f"{split}.bin").stat().st_size // 2
        print(f"{split}: {len(texts[split])} files, {n_bytes} bytes, {n_tok} tokens")


if __name__ == "__main__":
    main()


def heldout_documents(model_dir: Path) -> list[str]:
    """The held-out files' text, as shipped beside the model (``heldout.txt.gz``)."""
    with gzip.open(Path(model_dir) / "heldout.txt.gz", "rt", encoding="utf-8") as f:
        return f.read().split(FILE_SEPARATOR)


def heldout_stream(model_dir: Path) -> list[int]:
    """The held-out files as one token stream, each as <s> tokens </s> (as trained)."""
    return encode_documents(Path(model_dir), heldout_documents(model_dir)).tolist()


def token_bytes(model_dir: Path) -> list[int]:
    """UTF-8 bytes each token id stands for (0 for special tokens): byte-level BPE maps
    every byte to one character of its alphabet, so a token's length is its byte count."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    special = set(SPECIAL_TOKENS)
    sizes = [0] * tok.get_vocab_size()
    for piece, idx in tok.get_vocab().items():
        sizes[idx] = 0 if piece in special else len(piece)
    return sizes
