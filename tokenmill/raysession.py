"""The one Ray bootstrap: every tokenmill command that runs Ray tasks starts (or joins) Ray here.

An existing cluster, found the way Ray's own tools find it (:func:`ray_address`: an explicit
``--ray-address`` / ``TOKENMILL_RAY_ADDRESS``, else ``RAY_ADDRESS`` as ``ray job submit`` sets
it for its entrypoint; ``auto`` joins the cluster ``ray start`` made on this machine), or else
an embedded local Ray (``address="local"``: always a fresh instance, even when a ``ray start``
cluster on this machine would otherwise be joined implicitly), with one runtime environment:
the variables that decide where tokenizer files and Hub caches are found travel to every
worker.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Environment variables every Ray worker must see as the driver does.
WORKER_ENV = ("TIKTOKEN_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE",
              "HF_DATASETS_OFFLINE", "TOKENMILL_DATA_ROOT", "TOKENMILL_TASK_DELAY_S")


class _DropAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Token authentication is enabled for this Ray cluster" not in record.getMessage()


def _quiet_auth_notice() -> None:
    log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropAuthNotice) for f in log.filters):
        log.addFilter(_DropAuthNotice())


def ray_address(address: str | None = None) -> str | None:
    """The Ray cluster to join, or None for an embedded local Ray.

    In order: ``address`` (``--ray-address``), ``TOKENMILL_RAY_ADDRESS``, then ``RAY_ADDRESS``
    (what ``ray job submit`` sets for its entrypoint, and ``ray.init()`` itself reads). Each is
    ``HOST:PORT`` of the cluster's GCS or ``auto`` (the cluster ``ray start`` made on this
    machine), as :func:`ray.init` takes them.

    Raises:
        ValueError: the address is an ``http(s)://`` URL: that is the job API's (dashboard's)
            address, which ``ray job submit`` takes, not a cluster a driver can join.
    """
    for name, value in (("--ray-address", address),
                        ("TOKENMILL_RAY_ADDRESS", os.environ.get("TOKENMILL_RAY_ADDRESS")),
                        ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS"))):
        if value and value.strip():
            if value.startswith(("http://", "https://")):
                raise ValueError(f"{name}={value} is a Ray dashboard (job API) address; a "
                                 "driver joins a cluster by HOST:PORT of its GCS or 'auto' "
                                 "(or submit the command with `ray job submit`)")
            return value.strip()
    return None


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Start an embedded local Ray, or join the cluster :func:`ray_address` finds; no-op when
    Ray is already up.

    Args:
        address: ``HOST:PORT`` of a running cluster or ``auto``; None: the environment's
            (``TOKENMILL_RAY_ADDRESS``, ``RAY_ADDRESS``), else an embedded local Ray.
        num_cpus: CPUs of the embedded Ray (default: all of this machine's); ignored when
            joining a cluster.

    Returns:
        True when this call started Ray (the caller then shuts it down), else False.

    Raises:
        ValueError: a dashboard URL given as the address (see :func:`ray_address`).
        RuntimeError: no cluster answers at the address (one line naming it).
    """
    import ray

    if ray.is_initialized():
        return False
    env = {k: os.environ[k] for k in WORKER_ENV if k in os.environ}
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": False,
                              "configure_logging": False}
    address = ray_address(address)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as e:
            raise RuntimeError(f"could not join the Ray cluster at {address}: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                               ) from e
    else:
        # Ray turns token authentication on for a new local cluster and logs a notice
        # about opting out; for our own embedded instance that is noise, so it stays on
        # and the notice is dropped.
        _quiet_auth_notice()
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(),
                 include_dashboard=False, **kwargs)
    return True


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """``with ray_session(...):`` runs the body with Ray up, and shuts Ray down afterwards
    only if this call started it (a caller's own Ray session is left running)."""
    started = init_ray(address, num_cpus)
    try:
        yield
    finally:
        if started:
            import ray

            ray.shutdown()
