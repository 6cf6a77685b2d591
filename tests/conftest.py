import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.shared import shared_data_path

# Offline tokenizer files for every test, unless the caller chose a cache already.
_tk = shared_data_path() / "tiktoken"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _tk.exists():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_tk)
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def pytest_configure(config: pytest.Config) -> None:
    """Before the tests start, compile (or load) the per-document numba kernels once, in
    this process (``make setup`` has compiled them; a kernel changed since is compiled
    here): under pytest-xdist this runs in the controller before its workers exist, so
    that the workers and their subprocesses do not all compile it at once."""
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    from tokenmill.pipeline.warm import warm_numba_cache

    warm_numba_cache()


@pytest.fixture
def shared_data():
    from tests.shared import shared_data as _sd

    return _sd()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


#: test folders whose tests share one embedded Ray (2 CPUs) instead of starting their own:
#: a Ray start costs seconds, and the curation, n-gram and manifest tests start dozens
SHARED_RAY_DIRS = ("manifests", "ngram", "pipeline")

#: module fixtures that start a Ray of their own for their module's tests (higher-scoped
#: fixtures are set up before ``_shared_ray``, which must then leave that Ray running)
OWN_RAY_FIXTURES = ("ray_up",)


@pytest.fixture(autouse=True)
def _shared_ray(request):
    """Start the suite's one Ray before a test of ``SHARED_RAY_DIRS`` (a no-op when it is
    up; ``run_datamix`` then reuses it and leaves it running), and shut Ray down before
    any other test (except one using a module's own Ray, ``OWN_RAY_FIXTURES``), so that
    forking and multi-process tests (the trainer's) start clean."""
    from tokenmill.raysession import init_ray

    folder = Path(str(request.node.fspath)).parent.name
    if folder in SHARED_RAY_DIRS:
        init_ray(num_cpus=2)
    elif not set(OWN_RAY_FIXTURES) & set(request.fixturenames):
        shutdown_ray()
    yield


#: outputs that differ between runs: the report, and the stage times (stats.json)
REPORT_FILES = ("report.html", "stats.json")


def final_files(root: Path) -> dict[str, bytes]:
    """The outputs that must be byte-identical between runs: shards, sidecars, quarantine,
    manifest (not the intermediates, not the report's pictures, not the stage times)."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and "work" not in p.relative_to(root).parts
            and p.suffix != ".png" and p.name not in REPORT_FILES}


def run_quickstart_like(out_dir: Path, num_cpus: int = 2, datamix: str = "quickstart.yaml",
                        data_root: str | None = None, **overrides):
    """Run a datamix from manifests/ into ``out_dir`` with the embedded Ray."""
    from tests.shared import corpora
    from tokenmill.pipeline.config import load_datamix
    from tokenmill.pipeline.run.executor import run_datamix

    if num_cpus != 2:  # the shared Ray has 2 CPUs; any other count needs its own
        shutdown_ray()
    repo = Path(__file__).resolve().parents[1]
    cfg = load_datamix(repo / "manifests" / datamix, data_root=data_root or str(corpora()),
                       output_dir=str(out_dir))
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return run_datamix(cfg, num_cpus=num_cpus, progress=False)


def build_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that ``build(folder)`` fills once per test run: under pytest-xdist the first
    worker to get there builds it while the others wait on a file lock, then all share it
    (an expensive session fixture would otherwise be built once per worker). Consumers must
    treat the folder as read-only."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock

    folder = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").is_file():
            shutil.rmtree(folder, ignore_errors=True)  # a half-built folder of a crashed worker
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory):
    """The quickstart datamix run once per test run (2 Ray CPUs), shared by the pytest-xdist
    workers (:func:`build_once`): a RunResult. Its folder is read-only for tests."""
    def build(folder: Path) -> None:
        res = run_quickstart_like(folder / "out")
        (folder / "result.pickle").write_bytes(pickle.dumps(res))

    folder = build_once(tmp_path_factory, "quickstart", build)
    return pickle.loads((folder / "result.pickle").read_bytes())

