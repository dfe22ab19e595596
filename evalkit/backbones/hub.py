"""Checkpoints from the Hugging Face hub cache, for ``--pretrained`` timm and open_clip
backbones (docs/backbones.md, "Hub checkpoints").

A file is looked up in the hub's cache folder (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``): with ``HF_HUB_OFFLINE=1`` only there, otherwise the hub may
fetch it. A file that is in neither is a one-line error naming the repository, the file and
how to place it. The row's weights id is the file's content id, as for ``--weights PATH``, so
two caches holding the same bytes give the same id and a re-uploaded file a new one.

A revision (``timm/<model>.<tag>@REVISION``, a branch, tag or commit) is asked of the cache or
the hub as given; the commit it resolved to is the snapshot folder the file came from, and
``resolved(backbone)`` says it (rows record it as ``weights_source``).
"""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.data.hub import hub_cache, hub_reachable, offline, quiet_network
from evalkit.errors import EvalkitError

_RESOLVED: dict[str, str] = {}  # backbone → "hub <repo>@<commit>" of the file it loaded


def resolved(backbone: str) -> str | None:
    return _RESOLVED.get(backbone)


def cached_file(
    repo: str, filenames: tuple[str, ...], *, backbone: str, revision: str | None = None
) -> Path:
    """The first of ``filenames`` the hub repository has in the cache (or, online, fetches).
    Without a route to the hub the cache alone is asked at once: the client would otherwise
    retry each file for the better part of a minute before saying the same thing."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    local_only = offline() or not hub_reachable()
    for filename in filenames:
        try:
            with quiet_network():
                path = Path(
                    hf_hub_download(
                        repo,
                        filename,
                        cache_dir=hub_cache(),
                        revision=revision,
                        local_files_only=local_only,
                    )
                )
            _RESOLVED[backbone] = f"hub {repo}@{_commit(path, filename)}"
            return path
        except (EntryNotFoundError, LocalEntryNotFoundError):
            continue
        except Exception as exc:  # noqa: BLE001 - network and hub errors come in many types
            raise EvalkitError(
                f"{backbone}: the hub did not give {repo}/{filename} "
                f"({type(exc).__name__}): {_placing(repo, filename)}"
            ) from exc
    at = f" at revision {revision}" if revision else ""
    raise EvalkitError(
        f"{backbone}: no {' or '.join(filenames)} of hub repository {repo}{at} in the cache "
        f"{hub_cache()}: {_placing(repo, filenames[0])}"
    )


def _commit(path: Path, filename: str) -> str:
    """The commit of the snapshot ``path`` lies in (``…/snapshots/<commit>/<filename>``)."""
    snapshot = path
    for _ in Path(filename).parts:
        snapshot = snapshot.parent
    return snapshot.name if snapshot.parent.name == "snapshots" else "unknown"


def cached_json(repo: str, filename: str, revision: str | None = None) -> dict:
    """A JSON file of the repository if the cache has it (a checkpoint's own config), else {}."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo, filename, cache_dir=hub_cache(), revision=revision)
    if not isinstance(path, str):
        return {}
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _placing(repo: str, filename: str) -> str:
    folder = "models--" + repo.replace("/", "--")
    return (
        f"where there is a network run `hf download {repo} {filename}` and copy "
        f"{folder} into {hub_cache()}, or pass --weights PATH"
    )
