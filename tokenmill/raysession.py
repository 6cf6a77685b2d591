"""The one Ray bootstrap and task runner: every tokenmill command that runs Ray tasks
starts (or joins) Ray here and runs its tasks through :func:`run_tasks`.

Session (:func:`init_ray`, :func:`ray_session`). An existing cluster, found the way Ray's
own tools find it (:func:`ray_address`: an explicit ``--ray-address`` /
``TOKENMILL_RAY_ADDRESS``, else ``RAY_ADDRESS`` as ``ray job submit`` sets it for its
entrypoint; ``auto`` joins the cluster ``ray start`` made on this machine), or else an
embedded local Ray (``address="local"``: always a fresh instance, even when a ``ray start``
cluster on this machine would otherwise be joined implicitly). The variables that
decide where tokenizer files and Hub caches are found (:data:`WORKER_ENV`) travel to
every worker of a joined cluster in one runtime environment; an embedded Ray's workers
inherit them with the rest of this process's environment.

Tasks. :func:`run_tasks` submits a list of :class:`TaskCall` (a plain function, its
arguments, and Ray task options such as ``num_cpus``, ``resources`` or a
``scheduling_strategy``) as Ray tasks and yields their results, in call order
(``ordered=True``) or as they complete (``ordered=False``, as ``(index, result)``); an
``on_done(index, result)`` callback sees each result as it arrives (a progress bar).
When the caller stops early (an exception in a task, ``KeyboardInterrupt``, or closing
the generator), the tasks still pending are cancelled, so nothing keeps running after
the command. A task that fails with an exception raises it in the caller; a task whose
worker died is retried (``max_retries``, Ray's own retry). Example::

    with ray_session():
        calls = [TaskCall(work, (item,), {"num_cpus": 1}) for item in items]
        results = list(run_tasks(calls, on_done=lambda i, r: bar.update(1)))

:class:`TaskPool` is the same runner for a caller that submits tasks one at a time and
collects each by its handle when it needs it (the trainer's LEM workers keep a few chunks in
flight ahead of the step they read); closing it cancels what is still pending.
:func:`put_shared` puts one large argument (a token stream) in Ray's object store once, for
many tasks to read without a copy each.

:func:`starts_local_ray` tells whether a session would start an embedded Ray (seconds of
start-up a caller may fill with work of its own). :func:`on_this_node` gives the options
that pin a task to the driver's node (for tasks sharing ``/dev/shm`` with the driver),
:func:`only_this_node` whether every Ray node is the driver's machine; :func:`cluster_cpus`
the cluster's CPUs (to size batches of tasks).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: Environment variables every Ray worker must see as the driver does: where tokenizer
#: files and Hub caches are, and which object store to reach (endpoint, region; never a
#: credential: a runtime environment is visible in Ray's dashboard, so credentials come
#: from each node's own environment, instance role or profile)
WORKER_ENV = ("TIKTOKEN_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE",
              "HF_DATASETS_OFFLINE", "TOKENMILL_DATA_ROOT", "TOKENMILL_TASK_DELAY_S",
              "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
              "AWS_EC2_METADATA_DISABLED", "NO_GCE_CHECK", "ARROW_DEFAULT_MEMORY_POOL")


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

    _finish_shutdown()  # a session shut down behind the caller: its processes gone first
    if ray.is_initialized():
        return False
    env = {k: os.environ[k] for k in WORKER_ENV if k in os.environ}
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    address = ray_address(address)
    if address:
        try:
            ray.init(address=address, runtime_env={"env_vars": env}, **kwargs)
        except ConnectionError as e:
            raise RuntimeError(f"could not join the Ray cluster at {address}: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                               ) from e
    else:
        # Ray turns token authentication on for a new local cluster and logs a notice
        # about opting out; for our own embedded instance that is noise, so it stays on
        # and the notice is dropped.
        _quiet_auth_notice()
        # no runtime environment: the workers of an embedded Ray are this process's
        # grandchildren and inherit its environment; with one, Ray would start other
        # workers than the ones it prestarts (about 0.6 s before the first task runs)
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(),
                 include_dashboard=False, **kwargs)
    return True


def starts_local_ray(address: str | None = None) -> bool:
    """Whether :func:`init_ray` with ``address`` would start an embedded local Ray (no
    Ray up in this process, no cluster address given or in the environment)."""
    import ray

    _finish_shutdown()
    return not ray.is_initialized() and ray_address(address) is None


#: a shutdown of Ray still waiting for Ray's processes to exit (:func:`ray_session` with
#: ``shutdown_behind``); the next :func:`init_ray` waits for it, as does the interpreter's
#: exit (the thread is not a daemon)
_shutting_down: threading.Thread | None = None


def _finish_shutdown() -> None:
    global _shutting_down
    if _shutting_down is not None:
        _shutting_down.join()
        _shutting_down = None


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None,
                shutdown_behind: bool = False) -> Iterator[None]:
    """``with ray_session(...):`` runs the body with Ray up, and shuts Ray down afterwards
    only if this call started it (a caller's own Ray session is left running).

    ``shutdown_behind``: the shutdown, which mostly waits about a second for Ray's
    processes to exit, runs in a thread while the caller goes on (for work after the last
    task: a report); the next session and the interpreter's exit wait for it."""
    global _shutting_down
    started = init_ray(address, num_cpus)
    try:
        yield
    finally:
        if started:
            import ray

            if shutdown_behind:
                _shutting_down = threading.Thread(target=ray.shutdown,
                                                  name="tokenmill-ray-shutdown")
                _shutting_down.start()
            else:
                ray.shutdown()


@dataclass(frozen=True)
class TaskCall:
    """One Ray task: ``fn(*args)`` with Ray task options.

    Attributes:
        fn: a plain module-level function (what Ray pickles and calls on a worker).
        args: its positional arguments (picklable, or Ray object refs).
        options: Ray task options (``num_cpus``, ``resources``, ``scheduling_strategy``,
            ...), passed to ``.options()``; the task's ``name`` defaults to ``fn``'s name.
        kwargs: its keyword arguments (picklable, or Ray object refs).
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def cluster_cpus() -> int:
    """CPUs of the running Ray cluster (at least 1)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def on_this_node() -> dict[str, Any]:
    """Task options pinning a task to the driver's node (hard affinity). Ray must be up."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def only_this_node() -> bool:
    """Whether the running Ray is this machine alone, with this driver on it (not a Ray
    Client): its workers can then map this machine's files (``/dev/shm``)."""
    import ray

    if ray.util.client.ray.is_connected():
        return False
    nodes = [d for d in ray.nodes() if d.get("Alive")]
    return len(nodes) == 1 and nodes[0].get("NodeManagerAddress") == \
        ray.util.get_node_ip_address()


def put_shared(value: Any) -> Any:
    """Put ``value`` in Ray's object store once and return its object ref: passed in many
    :class:`TaskCall` arguments, every task reads that one copy (a numpy array zero-copy,
    read-only) instead of Ray storing the value again for each task. Ray must be up."""
    import ray

    return ray.put(value)


class TaskPool:
    """Ray tasks submitted one at a time and collected by handle, on the running Ray.

    ``submit(call)`` starts a :class:`TaskCall` and returns its handle (0, 1, 2, ... in
    submission order); ``result(handle)`` waits for that task and returns its result;
    ``next_done()`` waits for whichever pending task finishes first. ``cancel(handle)`` and
    ``close()`` (also on leaving a ``with`` block) cancel pending tasks, so nothing keeps
    running for a result nobody will read.

    Args:
        max_retries: retries of a task whose worker died (exceptions are not retried).
    """

    def __init__(self, max_retries: int = 3) -> None:
        self.max_retries = max_retries
        self._remotes: dict[Callable[..., Any], Any] = {}
        self._refs: dict[int, Any] = {}
        self._cancelled: list[Any] = []  # refs cancelled, not yet seen to have stopped
        self._submitted = 0

    def __len__(self) -> int:
        """Tasks submitted and not yet collected or cancelled."""
        return len(self._refs)

    def __contains__(self, handle: int) -> bool:
        return handle in self._refs

    def __enter__(self) -> TaskPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, call: TaskCall) -> int:
        """Start ``call`` as a Ray task; return its handle."""
        import ray

        remote = self._remotes.get(call.fn)
        if remote is None:
            remote = self._remotes[call.fn] = ray.remote(call.fn)
        opts = {"name": getattr(call.fn, "__name__", "task"), "max_retries": self.max_retries,
                "retry_exceptions": False, **call.options}
        handle, self._submitted = self._submitted, self._submitted + 1
        self._refs[handle] = remote.options(**opts).remote(*call.args, **call.kwargs)
        return handle

    def result(self, handle: int) -> Any:
        """Wait for the task ``handle`` and return its result (the handle is then spent).

        Raises:
            KeyError: ``handle`` is not pending (collected, cancelled or never submitted).
            whatever the task raised (Ray's ``RayTaskError`` wrapping it).
        """
        import ray

        return ray.get(self._refs.pop(handle))

    def next_done(self) -> tuple[int, Any]:
        """Wait for the first pending task to finish: ``(handle, result)``.

        Raises:
            ValueError: no task is pending.
            whatever the task raised (Ray's ``RayTaskError`` wrapping it).
        """
        import ray

        if not self._refs:
            raise ValueError("no Ray task is pending")
        handles = {ref: h for h, ref in self._refs.items()}
        ready, _ = ray.wait(list(handles), num_returns=1)
        return handles[ready[0]], self.result(handles[ready[0]])

    def cancel(self, handle: int) -> None:
        """Cancel the task ``handle`` if it is pending (its result is never read). A task
        already running is stopped by ending its worker process (Ray then starts another);
        Ray's gentler cancel raises ``KeyboardInterrupt`` in the task, which does not
        reach it everywhere. :meth:`close` makes sure the task has stopped."""
        import ray

        ref = self._refs.pop(handle, None)
        if ref is not None:
            ray.cancel(ref, force=True)
            self._cancelled.append(ref)

    def close(self, settle_s: float = 60.0) -> None:
        """Cancel every pending task and wait until every cancelled task has stopped.

        Ray can miss a cancel that arrives while a task is being handed to its worker
        (ray-project/ray#24359; seen here as a cancelled task running to its end), so a
        cancelled task that has not stopped is cancelled again every half second, for at
        most ``settle_s`` seconds.
        """
        import time

        import ray

        for handle in list(self._refs):
            self.cancel(handle)
        waiting, deadline = self._cancelled, time.monotonic() + settle_s
        while waiting and time.monotonic() < deadline:
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=0.5)
            for ref in waiting:
                ray.cancel(ref, force=True)
        self._cancelled = []


def run_tasks(calls: Sequence[TaskCall], *, ordered: bool = True,
              on_done: Callable[[int, Any], None] | None = None,
              max_retries: int = 3) -> Iterator[Any]:
    """Run ``calls`` as Ray tasks on the running Ray; yield their results.

    Args:
        calls: the tasks, all submitted at once.
        ordered: yield results in call order (each as soon as it and the ones before it
            are done); ``False``: yield ``(index, result)`` in completion order.
        on_done: called with ``(index, result)`` as each task completes (any order).
        max_retries: retries of a task whose worker died (exceptions are not retried).

    Raises:
        whatever a task raised (Ray's ``RayTaskError`` wrapping it); the tasks still
        pending are then cancelled, as they are when the caller is interrupted or closes
        the generator early.
    """
    with TaskPool(max_retries) as pool:
        for call in calls:
            pool.submit(call)  # handle == index in calls
        done: dict[int, Any] = {}
        nxt = 0
        while pool:
            i, result = pool.next_done()
            if on_done is not None:
                on_done(i, result)
            if not ordered:
                yield i, result
                continue
            done[i] = result
            while nxt in done:
                yield done.pop(nxt)
                nxt += 1
