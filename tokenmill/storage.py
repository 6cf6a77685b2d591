"""Where bytes live: a local path or an object-store URL, behind one set of functions.

A location is a local path or a URL: ``s3://bucket/key`` and ``gs://bucket/key`` through
pyarrow's S3 and GCS file systems (wrapped as fsspec file systems, one code path for
both), ``hf://datasets/org/name/...`` and any other scheme through ``fsspec``. Credentials
and endpoints come only from each system's standard environment: the AWS variables and
profiles (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` or
``AWS_ENDPOINT_URL_S3`` for an S3-compatible server), ``GOOGLE_APPLICATION_CREDENTIALS``,
``HF_TOKEN``; none is ever written anywhere, and every message names a URL without its
``user:password@`` part (:func:`redact`).

Commits without a rename: an object appears whole when its upload completes (S3 and GCS
make a single PUT or a completed multipart upload visible at once), so a reader never sees
a torn object; what says that a *set* of objects is finished is a record written after them
(a work output's ``.done.json``, the run's ``manifest.json``), as datatrove's completion
files do. Work that needs a local file (parquet writers, memory maps) happens in a
node-local staging folder (:func:`local_dir`) whose files are uploaded and downloaded
whole; no process ever needs a disk shared with another node.

A top-level helper: it imports nothing from tokenmill's packages.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from tokenmill.atomic import atomic_open, atomic_write_bytes

_CHUNK = 1 << 20
_USERINFO = re.compile(r"(\b[a-zA-Z][\w+.-]*://)[^/@\s]*@")


class StorageError(RuntimeError):
    """A location cannot be read or written: one line naming its URL and why (no such
    bucket, access denied, no credentials, ...)."""


def is_url(where: str | os.PathLike) -> bool:
    """Whether ``where`` is a URL (``scheme://...``) rather than a local path."""
    return "://" in str(where)


def redact(text: str) -> str:
    """``text`` with the ``user:password@`` part of every URL in it removed."""
    return _USERINFO.sub(r"\1", text)


def normalize(where: str | os.PathLike) -> str:
    """A folder location in one spelling: a URL without a trailing ``/``, a local path
    absolute (:meth:`Path.resolve`)."""
    if is_url(where):
        return str(where).rstrip("/")
    return str(Path(where).resolve())


def join(base: str | os.PathLike, *parts: str) -> str:
    """``base`` joined with ``parts`` (``/``-separated for a URL, the OS's for a path)."""
    if not is_url(base):
        return str(Path(base, *parts))
    tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return f"{str(base).rstrip('/')}/{tail}" if tail else str(base).rstrip("/")


def staging_root() -> Path:
    """This node's staging folder: ``TOKENMILL_STAGING_DIR``, else ``tokenmill-staging-UID``
    in the system's temporary folder (``TMPDIR``)."""
    env = os.environ.get("TOKENMILL_STAGING_DIR")
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"tokenmill-staging-{os.getuid()}"


def local_dir(where: str | os.PathLike) -> Path:
    """The local folder that holds ``where``'s files on this node: ``where`` itself for a
    local path; for a URL, a folder of :func:`staging_root` named by the URL's sha256
    (copies of the objects this node read or wrote there; it may be deleted between runs)."""
    if not is_url(where):
        return Path(where)
    return staging_root() / hashlib.sha256(normalize(where).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------
# file systems
# ---------------------------------------------------------------------------------------
@functools.cache
def _filesystem(scheme: str) -> Any:
    """The fsspec file system of ``scheme``, made once per process from the environment."""
    import fsspec

    if scheme in ("s3", "s3a", "gs", "gcs"):
        import pyarrow.fs as pafs
        from fsspec.implementations.arrow import ArrowFSWrapper

        if scheme.startswith("s3"):
            kw: dict[str, Any] = {}
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
                "AWS_ENDPOINT_URL")
            if endpoint:
                kw["endpoint_override"] = endpoint
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if region:
                kw["region"] = region
            return ArrowFSWrapper(pafs.S3FileSystem(**kw))
        # without a limit the client retries for many minutes when it finds no
        # credentials (a machine outside Google Cloud), silently
        return ArrowFSWrapper(pafs.GcsFileSystem(retry_time_limit=timedelta(seconds=30)))
    return fsspec.filesystem(scheme)


def split(url: str) -> tuple[Any, str]:
    """``(fsspec file system, path in it)`` of ``url`` (``bucket/key`` for S3 and GCS).

    Raises:
        StorageError: credentials written in the URL (``s3://KEY:SECRET@bucket``: they
            would end up in logs and job records), or a ``gs://`` URL on a machine that
            says it is not on Google Cloud (``NO_GCE_CHECK=true``) with no credentials.
    """
    scheme, _, rest = url.partition("://")
    if "@" in rest.split("/", 1)[0]:
        raise StorageError(f"{redact(url)}: credentials in a URL are not taken; give them "
                           "in the environment (AWS_ACCESS_KEY_ID / AWS_PROFILE, "
                           "GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN)")
    low = scheme.lower()
    if low in ("gs", "gcs") and _no_credentials(url) and _adc_file() is None \
            and os.environ.get("NO_GCE_CHECK", "").lower() in ("1", "true", "yes"):
        raise StorageError(f"{url}: no credentials for Google Cloud Storage in the "
                           "environment (GOOGLE_APPLICATION_CREDENTIALS, or gcloud's "
                           "application default credentials)")
    fs = _filesystem(low)
    if low in ("s3", "s3a", "gs", "gcs"):
        return fs, rest.rstrip("/")
    return fs, fs._strip_protocol(url).rstrip("/")


def _adc_file() -> Path | None:
    """gcloud's application default credentials file, when there is one."""
    folder = os.environ.get("CLOUDSDK_CONFIG") or Path("~/.config/gcloud").expanduser()
    path = Path(folder) / "application_default_credentials.json"
    return path if path.is_file() else None


def _no_credentials(url: str) -> bool:
    """No credentials for ``url``'s system in its standard environment (checked only to
    word an error: an access refused without them is a missing-credentials problem)."""
    env = os.environ
    if url.lower().startswith("s3"):
        files = [env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
                 env.get("AWS_CONFIG_FILE", "~/.aws/config")]
        return not (env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_PROFILE")
                    or env.get("AWS_WEB_IDENTITY_TOKEN_FILE")
                    or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                    or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                    or any(Path(f).expanduser().is_file() for f in files))
    if url.lower().startswith("g"):
        return not env.get("GOOGLE_APPLICATION_CREDENTIALS")
    return False


def _why(url: str, e: BaseException) -> str:
    text = " ".join(str(e).split())
    low = text.lower()
    if "no_such_bucket" in low or "nosuchbucket" in low or "bucket does not exist" in low:
        return "the bucket does not exist"
    denied = (isinstance(e, PermissionError) or "access_denied" in low or "accessdenied" in low
              or "forbidden" in low or " 403" in low or "invalidaccesskeyid" in low
              or "signaturedoesnotmatch" in low)
    if not isinstance(e, FileNotFoundError) and _no_credentials(url):
        return ("no credentials found in the environment (AWS_ACCESS_KEY_ID or AWS_PROFILE "
                "or ~/.aws/credentials; GOOGLE_APPLICATION_CREDENTIALS for gs://)")
    if denied:
        return "access denied (the credentials in the environment may not do this)"
    if isinstance(e, FileNotFoundError):
        cause = e.__cause__  # fsspec's HTTP client says "not found" when it cannot connect
        if cause is not None and not isinstance(cause, FileNotFoundError):
            return f"{type(cause).__name__}: {' '.join(str(cause).split())[:200]}"
        return "not found"
    first = text.split(". Detail:")[0][:200]
    return f"{type(e).__name__}: {first}"


def error(url: str, e: BaseException, doing: str) -> StorageError:
    """One line naming ``url`` (redacted), what was being done, and why it failed."""
    return StorageError(f"{redact(url)}: cannot {doing}: {redact(_why(url, e))}")


def _call(url: str, doing: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``; any error raised again as one :class:`StorageError` line (raised
    outside the handler, so the client's error with its request details is not chained)."""
    try:
        return fn(*args)
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 (every client's error becomes one line)
        failure = error(url, e, doing)
    raise failure


# ---------------------------------------------------------------------------------------
# operations on a location (a local path or a URL)
# ---------------------------------------------------------------------------------------
def exists(where: str | os.PathLike) -> bool:
    """Whether a file or folder is at ``where``."""
    if not is_url(where):
        return Path(where).exists()
    fs, path = split(str(where))
    return bool(_call(str(where), "look up", fs.exists, path))


def is_dir(where: str | os.PathLike) -> bool:
    """Whether ``where`` is a folder (for a URL: a prefix with objects below it)."""
    if not is_url(where):
        return Path(where).is_dir()
    fs, path = split(str(where))
    return bool(_call(str(where), "list", fs.isdir, path))


def check_bucket(url: str) -> None:
    """Raise :class:`StorageError` naming ``url`` when its bucket is missing or not
    readable with the environment's credentials (nothing for a local path)."""
    if not is_url(url) or not url.lower().startswith(("s3", "gs")):
        return
    fs, path = split(url)
    bucket = path.split("/", 1)[0]
    failure = StorageError(f"{redact(url)}: the bucket does not exist")
    try:
        if fs.info(bucket).get("type") == "directory":
            return
    except FileNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001
        failure = error(url, e, "reach its bucket")
    raise failure


def read_bytes(where: str | os.PathLike) -> bytes:
    """The bytes of the file at ``where``.

    Raises:
        FileNotFoundError: a local file is missing. StorageError: a URL cannot be read.
    """
    if not is_url(where):
        return Path(where).read_bytes()
    fs, path = split(str(where))
    return _call(str(where), "read", fs.cat_file, path)


def write_bytes(where: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` at ``where`` whole: a local file atomically (temp + rename), an
    object in one upload (visible only once complete)."""
    if not is_url(where):
        atomic_write_bytes(where, data)
        return
    fs, path = split(str(where))
    _call(str(where), "write", fs.pipe_file, path, data)


def upload(local: str | os.PathLike, url: str) -> None:
    """Copy the local file ``local`` to ``url`` in one upload (a local target: atomic)."""
    if not is_url(url):
        if Path(local).resolve() != Path(url).resolve():
            with open(local, "rb") as src, atomic_open(url) as out:
                shutil.copyfileobj(src, out, _CHUNK)
        return
    fs, path = split(url)

    def put() -> None:
        with open(local, "rb") as src, fs.open(path, "wb") as out:
            shutil.copyfileobj(src, out, _CHUNK)

    _call(url, "write", put)


def download(url: str, local: str | os.PathLike) -> None:
    """Copy ``url`` to the local file ``local`` atomically (a failed copy leaves nothing)."""
    fs, path = split(url)

    def get() -> None:
        with fs.open(path, "rb") as src, atomic_open(local) as out:
            shutil.copyfileobj(src, out, _CHUNK)

    _call(url, "read", get)


def fetch(url: str, local: str | os.PathLike) -> bool:
    """Download ``url`` to ``local`` when it exists there; ``False`` when it does not."""
    fs, path = split(url)
    try:
        with fs.open(path, "rb") as src, atomic_open(local) as out:
            shutil.copyfileobj(src, out, _CHUNK)
    except FileNotFoundError:
        return False
    except Exception as e:  # noqa: BLE001
        failure = error(url, e, "read")
    else:
        return True
    raise failure


def remove(where: str | os.PathLike) -> None:
    """Delete the file at ``where`` (nothing when it is absent)."""
    if not is_url(where):
        Path(where).unlink(missing_ok=True)
        return
    fs, path = split(str(where))
    if _call(str(where), "look up", fs.exists, path):
        _call(str(where), "delete", fs.rm_file, path)


def remove_tree(where: str | os.PathLike) -> None:
    """Delete the folder ``where`` and everything below it (nothing when absent)."""
    if not is_url(where):
        shutil.rmtree(where, ignore_errors=True)
        return
    for rel in list_tree(str(where)):
        remove(join(str(where), rel))


def list_tree(where: str | os.PathLike) -> dict[str, int]:
    """``{relative posix path: size in bytes}`` of every file below the folder ``where``,
    sorted by path (``{}`` when there is none)."""
    if not is_url(where):
        root = Path(where)
        if not root.is_dir():
            return {}
        return {p.relative_to(root).as_posix(): p.stat().st_size
                for p in sorted(root.rglob("*")) if p.is_file()}
    fs, path = split(str(where))
    found = _call(str(where), "list", fs.find, path, None, False, True)
    prefix = path.rstrip("/") + "/"
    return {k[len(prefix):]: int(v.get("size") or 0) for k, v in sorted(found.items())
            if k.startswith(prefix) and v.get("type") != "directory"}


def upload_tree(local: str | os.PathLike, url: str, names: list[str] | None = None) -> None:
    """Upload the files below the local folder ``local`` (or only ``names``, relative
    posix paths) to the same relative paths under ``url``."""
    root = Path(local)
    rels = names if names is not None else list(list_tree(root))
    for rel in rels:
        upload(root / rel, join(url, rel))


def publish_folder(local: str | os.PathLike, url: str, commit: str) -> None:
    """Upload the files below the local folder ``local`` to ``url`` with the record
    ``commit`` (a relative posix path, e.g. ``export.json``) uploaded last and the old one
    removed first: a reader that finds the record finds every file it lists (a local
    ``url`` other than ``local`` gets copies, each atomic)."""
    if not is_url(url) and Path(local).resolve() == Path(url).resolve():
        return
    remove(join(url, commit))
    upload_tree(local, url, [n for n in list_tree(local) if n != commit])
    upload(Path(local) / commit, join(url, commit))


@contextlib.contextmanager
def output_folder(where: str | os.PathLike, commit: str) -> Iterator[Path]:
    """The local folder a command writes its output folder ``where`` in: ``where`` itself
    for a local path; for a URL, a fresh temporary folder of :func:`staging_root`,
    uploaded when the block ends without an error with ``commit`` last
    (:func:`publish_folder`), then deleted. A failed block uploads nothing.

    Raises:
        StorageError: the URL's bucket is missing or unreadable (before the block runs),
            or an upload fails (one line naming the URL).
    """
    if not is_url(where):
        yield Path(where)
        return
    url = normalize(where)
    check_bucket(url)
    staging = staging_root()
    staging.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="output-", dir=staging) as tmp:
        yield Path(tmp)
        publish_folder(tmp, url, commit)
