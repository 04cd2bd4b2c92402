"""What a TorchTitan run reads and its wheel does not ship: a tokenizer and a text dataset.

Used by tests/titan/test_torchtitan.py and bench/titan_train.py.
"""

from __future__ import annotations

import json
import random

WORDS = [f"w{i}" for i in range(2000)]


def write_assets(folder) -> tuple[str, str]:
    """A word-level tokenizer (``--model.hf_assets_path``) and a c4-style JSON-lines dataset."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer_dir, data_dir = folder / "tokenizer", folder / "data"
    data_dir.mkdir(parents=True)
    vocab = {word: i for i, word in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                         eos_token="<eos>", unk_token="<unk>").save_pretrained(tokenizer_dir)
    rng = random.Random(0)
    with open(data_dir / "data.json", "w") as f:
        for _ in range(200):
            f.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randrange(20, 200)))}) + "\n")
    return str(tokenizer_dir), str(data_dir)
