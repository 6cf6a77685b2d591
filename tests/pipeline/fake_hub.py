"""A stand-in for the Hugging Face Hub on 127.0.0.1 (``HF_ENDPOINT``): the few endpoints
``huggingface_hub`` calls for a dataset repository, served from a dict of files at one
commit, every request logged. Endpoints (as ``huggingface_hub``'s ``HfApi`` and
``hf_hub_download`` call them):

- ``GET /api/datasets/{repo}/revision/{rev}``: repo info, ``sha`` the commit;
- ``GET /api/datasets/{repo}/tree/{rev}[/{path}]`` (``recursive``): the listing;
- ``POST /api/datasets/{repo}/paths-info/{rev}``: the entries of form field ``paths``;
- ``HEAD`` / ``GET /datasets/{repo}/resolve/{rev}/{path}``: a file, with ``X-Repo-Commit``,
  ``ETag`` and ``Content-Length``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class FakeRepo:
    repo_id: str
    commit: str
    files: dict[str, bytes]
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, unquoted path)

    def entry(self, path: str) -> dict | None:
        if path in self.files:
            data = self.files[path]
            return {"type": "file", "path": path, "size": len(data),
                    "oid": hashlib.sha1(data).hexdigest()}
        if any(f.startswith(path + "/") for f in self.files):
            return {"type": "directory", "path": path, "size": 0,
                    "oid": hashlib.sha1(path.encode()).hexdigest()}
        return None

    def tree(self, path: str, recursive: bool) -> list[dict] | None:
        prefix = path + "/" if path else ""
        if path and self.entry(path) is None:
            return None
        names: set[str] = set()
        for f in self.files:
            if not f.startswith(prefix):
                continue
            parts = f[len(prefix):].split("/")
            depth = len(parts) if recursive else 1
            for i in range(1, depth + 1):
                names.add(prefix + "/".join(parts[:i]))
        return [self.entry(n) for n in sorted(names)]


def _handler(repo: FakeRepo) -> type[BaseHTTPRequestHandler]:
    api = f"/api/datasets/{repo.repo_id}/"
    resolve = f"/datasets/{repo.repo_id}/resolve/"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the test reads repo.requests instead
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str],
                  head: bool = False) -> None:
            self.send_response(status)
            for k, v in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
            self._send(status, json.dumps(obj).encode(),
                       {"Content-Type": "application/json", **(headers or {})})

        def _missing(self, code: str = "EntryNotFound", head: bool = False) -> None:
            self._send(404, b'{"error": "not found"}',
                       {"Content-Type": "application/json", "X-Error-Code": code}, head)

        def _rev_ok(self, rev: str) -> bool:
            return unquote(rev) in ("main", repo.commit)

        def _route(self, head: bool = False) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            repo.requests.append((self.command, path))
            if path.startswith(resolve):
                rev, _, rel = path[len(resolve):].partition("/")
                if not self._rev_ok(rev):
                    return self._missing("RevisionNotFound", head)
                if rel not in repo.files:
                    return self._missing(head=head)
                data = repo.files[rel]
                etag = hashlib.sha256(data).hexdigest()
                return self._send(200, data, {"X-Repo-Commit": repo.commit,
                                              "ETag": f'"{etag}"'}, head)
            if not path.startswith(api):
                return self._missing("RepoNotFound", head)
            kind, _, rest = path[len(api):].partition("/")
            rev, _, sub = rest.partition("/")
            if not self._rev_ok(rev):
                return self._missing("RevisionNotFound")
            if kind == "revision":
                return self._json({"id": repo.repo_id, "sha": repo.commit, "private": False,
                                   "siblings": [{"rfilename": f} for f in sorted(repo.files)]})
            if kind == "tree":
                query = parse_qs(url.query)
                listing = repo.tree(sub.strip("/"), query.get("recursive") == ["True"]
                                    or query.get("recursive") == ["true"])
                return self._missing() if listing is None else self._json(listing)
            return self._missing()

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            self._route()

        def do_HEAD(self) -> None:  # noqa: N802
            self._route(head=True)

        def do_POST(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            path = unquote(url.path)
            repo.requests.append(("POST", path))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            prefix = f"{api}paths-info/"
            if not path.startswith(prefix) or not self._rev_ok(path[len(prefix):]):
                return self._missing()
            if "json" in (self.headers.get("Content-Type") or ""):
                paths = json.loads(body).get("paths", [])
            else:
                paths = parse_qs(body).get("paths", [])
            found = [e for p in paths if (e := repo.entry(p.strip("/"))) is not None]
            self._json(found)

    return Handler


@contextmanager
def fake_hub(repo: FakeRepo) -> Iterator[str]:
    """Serve ``repo`` on a free port of 127.0.0.1; yields the endpoint URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(repo))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def hub_env(tmp_path, endpoint: str) -> dict[str, str]:
    """The environment of a ``tokenmill`` subprocess that reads the Hub at ``endpoint`` (this
    stand-in), with its own cache and no offline switch or token from the caller."""
    import os

    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf-home"),
               HF_HUB_CACHE=str(tmp_path / "hf-cache"), HF_HUB_DISABLE_XET="1",
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_ETAG_TIMEOUT="30")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN"):
        env.pop(name, None)
    return env
