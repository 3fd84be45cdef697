#!/usr/bin/env python3
"""Golden encodings and decodings from Hugging Face `tokenizers` (run where it is installed).

usage: make_tokenizer_goldens.py CORPUS.json OUT_DIR NAME=path/to/tokenizer.json [NAME=... ...]
Writes OUT_DIR/<NAME>.json = {"tokenizers_version", "encode": [[ids]...] (add_special_tokens=False),
"decode": [{"ids": [...], "text": ...}]} where decode rows cover each corpus string's ids and random id runs
(which split UTF-8 sequences, so they exercise the replacement character).
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer


def main():
    corpus_path, out_dir = sys.argv[1:3]
    with open(corpus_path, encoding="utf-8") as f:
        corpus = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    for spec in sys.argv[3:]:
        name, path = spec.split("=", 1)
        tok = Tokenizer.from_file(path)
        enc = [e.ids for e in tok.encode_batch(corpus, add_special_tokens=False)]
        rng = random.Random(7)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        dec = []
        for ids in enc[:200]:
            dec.append(dict(ids=ids, text=tok.decode(ids, skip_special_tokens=False)))
        for _ in range(300):
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
            dec.append(dict(ids=ids, text=tok.decode(ids, skip_special_tokens=False)))
        with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(dict(tokenizers_version=tokenizers.__version__, tokenizer=os.path.basename(path),
                           encode=enc, decode=dec), f, ensure_ascii=False)
        print(name, "tokens:", sum(len(e) for e in enc), flush=True)


if __name__ == "__main__":
    main()
