"""A Hub dataset's config and split, read file by file: only what the datamix uses.

For a ``hub:`` source with ``config:`` / ``split:``, the data files of that config and split
are resolved at the pinned commit the way ``datasets`` resolves them for
``load_dataset(repo, config, split=...)`` (its ``HubDatasetModuleFactory``): the dataset
card's ``configs:`` YAML (``data_files`` patterns per split, ``data_dir``), else ``datasets``'
default layout patterns (``data/train-*``, ``{split}/``, ``*-{split}-*``, ...). The patterns are
globbed on the Hub through ``huggingface_hub.HfFileSystem`` (``hf://datasets/REPO@COMMIT``,
the API's tree listings, no file contents), and only the matched files are downloaded, one
``hf_hub_download`` each, into the usual HF cache (``HF_HOME`` / ``HF_HUB_CACHE``,
``HF_ENDPOINT``, ``HF_TOKEN``), so the snapshot folder the readers open holds the card and
those files, never the whole repository.
"""

from __future__ import annotations

from pathlib import Path

from tokenmill.pipeline.config import SourceConfig
from tokenmill.pipeline.read.readers import is_data_file, printable_name

CARD = "README.md"


class HubConfigError(ValueError):
    """A config or split that is not in the dataset (the message names the ones there are),
    data files tokenmill does not read, or files that could not be fetched."""


def _card_configs(folder: Path) -> dict:
    """The card's ``configs:`` as ``datasets`` reads them (config name -> its fields)."""
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard, DatasetCardData

    card = folder / CARD
    data = DatasetCard.load(card).data if card.is_file() else DatasetCardData()
    return MetadataConfigs.from_dataset_card_data(data)


def _config_patterns(configs: dict, config: str | None, base: str) -> tuple[str, dict, str]:
    """(config name, split -> data file patterns, base path they are relative to)."""
    from datasets.data_files import get_data_patterns, sanitize_patterns

    if not configs:  # no configs: YAML: one config, "default", in the default layout
        if config not in (None, "default"):
            raise HubConfigError(f"BuilderConfig {config!r} not found. Available: ['default']")
        return "default", get_data_patterns(base), base
    if config is None:
        config = configs.get_default_config_name()
        if config is None:
            raise HubConfigError("Config name is missing. Please pick one among the available "
                                 f"configs: {list(configs)}")
    if config not in configs:
        raise HubConfigError(f"BuilderConfig {config!r} not found. Available: {list(configs)}")
    params = configs[config]
    if params.get("data_dir"):
        base = f"{base}/{str(params['data_dir']).strip('/')}"
    if params.get("data_files") is not None:
        return config, sanitize_patterns(params["data_files"]), base
    return config, get_data_patterns(base), base


def hub_split_files(folder: Path, src: SourceConfig, commit: str) -> list[str]:
    """The repository paths of ``src``'s config and split at ``commit``, in ``datasets``'
    order, matched on the Hub (no file downloaded; the card must be in ``folder``).

    Raises:
        HubConfigError: an unknown config or split (naming the ones there are), a pattern
            naming a file that is not there, or a file outside the repository.
    """
    from datasets.data_files import DataFilesList

    repo_id = src.hub.partition("@")[0]
    root = f"hf://datasets/{repo_id}@{commit}"
    what = f"dataset {src.hub} config {src.config or 'default'!r}"
    try:
        name, patterns, base = _config_patterns(_card_configs(folder), src.config, root)
    except (HubConfigError, ValueError) as e:  # datasets' card checks raise ValueError
        raise HubConfigError(f"{what}: {e}") from e
    split = src.split or "train"
    if split not in patterns:
        raise HubConfigError(f"no split {split!r} in config {name!r} of {src.hub} (splits: "
                             f"{', '.join(map(str, patterns)) or 'none'})")
    try:
        urls = DataFilesList.from_patterns(list(patterns[split]), base_path=base)
    except FileNotFoundError as e:  # a pattern without wildcards that names no file
        raise HubConfigError(f"{what}: {e}") from e
    outside = [u for u in urls if not u.startswith(root + "/")]
    if outside:  # a card may name files of another repository; not this source's
        raise HubConfigError(f"{what} split {split!r}: data files outside the repository: "
                             f"{', '.join(outside[:3])}")
    return [url.removeprefix(root + "/") for url in urls]


def fetch_split_files(folder: Path, src: SourceConfig, commit: str) -> list[str]:
    """Resolve ``src``'s config and split at ``commit`` (:func:`hub_split_files`; narrowed
    by the source's ``allow_patterns``, if any) and download those files into the snapshot
    ``folder`` (``CACHE/datasets--ORG--NAME/snapshots/COMMIT``, as ``snapshot_download``
    gave it for the card); returns their paths relative to it.

    Raises:
        HubConfigError: as :func:`hub_split_files`; files of a type tokenmill does not
            read; a download that failed (naming the dataset and the error).
    """
    from huggingface_hub.utils import filter_repo_objects

    rels = hub_split_files(folder, src, commit)
    if src.allow_patterns:
        rels = list(filter_repo_objects(rels, allow_patterns=src.allow_patterns))
    bad = [r for r in rels if not is_data_file(r)]
    if bad:
        raise HubConfigError(f"data files of config {src.config or 'default'!r} split "
                             f"{src.split or 'train'!r} not readable by tokenmill: "
                             f"{', '.join(printable_name(b) for b in bad[:3])}")
    try:
        fetch_files(src.hub.partition("@")[0], commit, rels, cache=folder.parents[2])
    except Exception as e:  # any failure of the Hub client: one line naming the dataset
        raise HubConfigError(f"could not fetch Hub dataset {src.hub} ({client_error(e)})"
                             ) from e
    return rels


def fetch_files(repo_id: str, commit: str, paths: list[str], cache: Path | None = None) -> None:
    """Download ``paths`` of dataset ``repo_id`` at ``commit`` into HF cache ``cache``
    (default: ``HF_HUB_CACHE``'s), in its snapshot folder of that commit; each file once: a
    cached one is not fetched again."""
    from concurrent.futures import ThreadPoolExecutor

    from huggingface_hub import hf_hub_download

    def one(path: str) -> str:
        return hf_hub_download(repo_id, path, repo_type="dataset", revision=commit,
                               cache_dir=cache)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, paths))


def fetch_card(repo_id: str, revision: str | None) -> Path:
    """Download dataset ``repo_id``'s card at ``revision`` (default ``main``) alone; returns
    the snapshot folder of the commit the revision names (``snapshots/COMMIT``), where the
    data files go. A dataset without a card: the same folder, empty."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        card = hf_hub_download(repo_id, CARD, repo_type="dataset", revision=revision)
    except EntryNotFoundError:  # snapshot_download names the folder without a file in it
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision,
                                      allow_patterns=[CARD]))
    return Path(card).parent


def client_error(e: BaseException) -> str:
    """``"TypeName: message"`` of an error the Hub client raised, on one line (its messages
    span several: the request, the cause, advice)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set: then a source is read from the cached snapshot."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)
