"""The ``minhash-multicompare`` case (../shared/cases/minhash-multicompare/make_input.py),
copied as a function of the document count.

Every document is one shared 80-word block plus 20 random words, so every pair has the
same true Jaccard of word 5-gram shingles, 76/116 = 0.655 (< 0.8): fuzzy dedup at 0.8
must remove none. ``documents(3000)`` is exactly the original's ``src/boiler.jsonl``;
larger counts continue the same random stream. ``python minhash_multicompare.py N OUT``
writes N documents as JSONL.
"""

from __future__ import annotations

import json
import random
import string
import sys


def documents(n: int = 3000) -> list[str]:
    """The case's first ``n`` document texts (the original's random stream, seed 4)."""
    rng = random.Random(4)
    vocab = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))
             for _ in range(50000)]
    for _ in range(10000):  # advance the generator (keeps the original experiment's data)
        rng.choice(vocab)
    rng.shuffle(list(range(30)))
    boiler = " ".join(rng.choice(vocab) for _ in range(80))
    return [boiler + " " + " ".join(rng.choice(vocab) for _ in range(20)) for _ in range(n)]


if __name__ == "__main__":
    count, out = int(sys.argv[1]), sys.argv[2]
    with open(out, "w") as f:
        for text in documents(count):
            f.write(json.dumps({"text": text}) + "\n")
