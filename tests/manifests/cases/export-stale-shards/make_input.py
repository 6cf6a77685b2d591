# ruff: noqa  (copied verbatim from ../shared/cases/export-stale-shards)
"""src/a.jsonl: 400 short stories. With --edit: ' cat ' -> ' dog ' (both one GPT-2 token, so
every document keeps its token count; only the token ids change)."""
import json, random, sys
random.seed(7)
words = "the a small big red blue cat sat on mat and ran far away home today".split()
rows = [f"Story {i}: " + " ".join(random.choice(words) for _ in range(random.randint(40, 90))) + "."
        for i in range(400)]
if "--edit" in sys.argv:
    rows = [r.replace(" cat ", " dog ") for r in rows]
with open("src/a.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps({"text": r}) + "\n")
