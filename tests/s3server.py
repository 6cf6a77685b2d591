"""An S3-compatible server on 127.0.0.1 for the object-store tests: moto's server mode
(``moto[server]``) in its own process, reached by the real clients (pyarrow's S3 file
system in tokenmill, boto3 here) over HTTP, with ``AWS_EC2_METADATA_DISABLED`` and
``NO_GCE_CHECK`` set so that no client probes a cloud metadata address.

With ``auth=True`` the server checks every request's signature and IAM policy (moto's
``INITIAL_NO_AUTH_ACTION_COUNT``): :meth:`S3Server.start` makes an ``admin`` user allowed
everything and a ``reader`` allowed only to get and list, and :meth:`S3Server.env` gives
the credentials of either (or none).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

_SETUP_ACTIONS = 6  # the IAM calls of _make_users, made before the server checks requests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """A moto S3 server process on a free loopback port."""

    def __init__(self, auth: bool = False, log: Path | None = None) -> None:
        pytest.importorskip("moto.server", reason="moto[server] (the dev extra) is needed")
        self.auth = auth
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.keys: dict[str, tuple[str, str]] = {"admin": ("testing", "testing")}
        self.proc: subprocess.Popen | None = None
        self.log = log  # the server's request log (one line per HTTP request), if given

    def start(self) -> S3Server:
        env = dict(os.environ, MOTO_PORT=str(self.port))
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_SETUP_ACTIONS)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env, stdout=subprocess.DEVNULL,
            stderr=open(self.log, "ab") if self.log else subprocess.DEVNULL)  # noqa: SIM115
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        if self.auth:
            self._make_users()
        return self

    def _make_users(self) -> None:
        iam = self.client("iam")
        policies = {"admin": ["s3:*"], "reader": ["s3:GetObject", "s3:ListBucket",
                                                  "s3:HeadBucket", "s3:ListAllMyBuckets"]}
        for user, actions in policies.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps({
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            self.keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def env(self, user: str | None = "admin", base: dict | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) with the server's endpoint and ``user``'s
        credentials (``None``: no credentials anywhere)."""
        env = {k: v for k, v in (base or os.environ).items()
               if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true", NO_GCE_CHECK="true",
                   AWS_SHARED_CREDENTIALS_FILE="/nonexistent/credentials",
                   AWS_CONFIG_FILE="/nonexistent/config")
        if user is not None:
            env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = self.keys[user]
        return env

    def client(self, service: str = "s3", user: str = "admin"):
        import boto3

        key, secret = self.keys[user]
        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=key, aws_secret_access_key=secret)

    def put_folder(self, local: Path, bucket: str, prefix: str) -> None:
        """Upload every file below ``local`` to ``s3://bucket/prefix/...``."""
        s3 = self.client()
        for p in sorted(local.rglob("*")):
            if p.is_file():
                s3.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local).as_posix()}")

    def objects(self, bucket: str, prefix: str) -> dict[str, bytes]:
        """``{key relative to prefix: bytes}`` of every object below ``prefix``."""
        s3 = self.client()
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                 Prefix=prefix + "/"):
            for o in page.get("Contents", []):
                body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
                out[o["Key"][len(prefix) + 1:]] = body
        return out
