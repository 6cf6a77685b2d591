# ruff: noqa  (copied verbatim from ../shared/cases/export-stale-shards)
"""Compare mix.json's recorded sha256 (shards + curation manifest) with the files on disk,
and count exported train documents that contain ' dog ' (text that only the edited input has).
Usage: python verify.py mix.json EXPORT_DIR"""
import hashlib, json, os, sys
import numpy as np, pyarrow.parquet as pq, tiktoken
mix, exp = sys.argv[1], sys.argv[2]
root = os.path.dirname(os.path.abspath(mix))
m = json.load(open(mix))
def walk(o):
    if isinstance(o, dict):
        if "path" in o and "sha256" in o:
            yield o
        for v in o.values():
            yield from walk(v)
    elif isinstance(o, list):
        for v in o:
            yield from walk(v)
missing = differ = 0
ents = list(walk(m))
for e in ents:
    p = os.path.join(root, e["path"])
    if not os.path.exists(p):
        missing += 1; print("  missing:", e["path"])
    elif hashlib.sha256(open(p, "rb").read()).hexdigest() != e["sha256"]:
        differ += 1
print(f"mix.json lists {len(ents)} files with sha256: {missing} missing, {differ} differ on disk")
enc = tiktoken.get_encoding("gpt2")
b = f"{exp}/fineweb_train_000001.bin"
t = np.fromfile(b, dtype="<u2", offset=1024)
side = pq.read_table(b[:-4] + ".docs.parquet").to_pylist()
new = sum(" dog " in enc.decode(t[r["offset"]:r["offset"] + r["n_tokens"]].tolist()) for r in side)
print(f"exported train documents containing ' dog ' (not in the data mix.json was built from): {new} of {len(side)}")
