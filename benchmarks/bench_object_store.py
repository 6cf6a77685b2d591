"""`tokenmill run` with its data and output in an S3 bucket against the same run on a local
disk: wall time, the driver's and its children's CPU time, and what the bucket saw (HTTP
requests by method, objects and bytes written), per block and per document.

The bucket is moto's S3 server on 127.0.0.1 (`moto[server]`, the dev extra), so the
request counts are tokenmill's own and exact, and the timings include no network: on a
real store add its latency per request (tasks overlap them). Usage::

    python benchmarks/bench_object_store.py [--copies-of c4-en-sample,cc-main-2019-sample]
        [--block-documents 500] [--num-cpus 2]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.s3server import S3Server  # noqa: E402
from tests.shared import corpora  # noqa: E402

MIX = """\
name: bench
tokenizer: gpt2
block_documents: {block}
sources:
  - {{name: c4, path: c4-en-sample}}
  - {{name: cc, path: cc-main-2019-sample, document_license: cc-attributes}}
licenses:
  allow: [odc-by]
  document_deny_terms: [nc, nd]
quality: {{gopher_quality: {{}}, gopher_repetition: {{}}, c4: {{}}, fineweb: {{}}}}
fuzzy_dedup: {{}}
"""
#: a request line of the server's log (werkzeug colours some status lines)
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|POST|HEAD|DELETE) ')


def _run(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(wall s, CPU s of the children, stdout) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(r.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-documents", type=int, default=500)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-objstore-"))
    mix = tmp / "bench.yaml"
    mix.write_text(MIX.format(block=args.block_documents))
    base = dict(os.environ, PYTHONPATH=str(REPO), TOKENMILL_STAGING_DIR=str(tmp / "staging"))
    run = [sys.executable, "-m", "tokenmill.cli", "run", str(mix), "-q", "--no-report",
           "--num-cpus", str(args.num_cpus)]
    local = _run([*run, "--data-root", str(corpora()), "-o", str(tmp / "local")], base)
    srv = S3Server(log=tmp / "requests.log").start()
    try:
        s3 = srv.client()
        s3.create_bucket(Bucket="data")
        s3.create_bucket(Bucket="runs")
        for name in ("c4-en-sample", "cc-main-2019-sample"):
            srv.put_folder(corpora(name), "data", f"corpora/{name}")
        skip = len(_REQUEST.findall((tmp / "requests.log").read_text()))
        bucket = _run([*run, "--data-root", "s3://data/corpora", "-o", "s3://runs/bench"],
                      srv.env(base=base))
        requests = Counter(_REQUEST.findall((tmp / "requests.log").read_text())[skip:])
        objects = srv.objects("runs", "bench")
    finally:
        srv.stop()
    blocks_line = next(x for x in bucket[2].splitlines() if x.startswith("blocks:"))
    blocks = int(blocks_line.split()[1])
    docs = int(next(x for x in bucket[2].splitlines() if x.startswith("TOTAL")).split()[1])
    written = sum(len(v) for v in objects.values())
    total = sum(requests.values())
    print(f"{docs} documents, {blocks} blocks of up to {args.block_documents}, "
          f"{args.num_cpus} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'run':8} {'wall s':>8} {'CPU s':>8}")
    for name, (wall, cpu, _) in (("local", local), ("bucket", bucket)):
        print(f"{name:8} {wall:8.1f} {cpu:8.1f}")
    print(f"bucket/local: wall {bucket[0] / local[0]:.2f}x, CPU {bucket[1] / local[1]:.2f}x")
    print(f"requests: {total} ({', '.join(f'{k} {v}' for k, v in requests.most_common())}); "
          f"{total / blocks:.0f} per block, {total / docs:.3f} per document")
    print(f"objects written: {len(objects)}, {written / 1e6:.1f} MB "
          f"({written / docs / 1e3:.1f} KB per document)")


if __name__ == "__main__":
    main()
