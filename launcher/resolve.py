"""Turn what the operator typed into a model: an alias, a local directory or a Hugging Face id.

All three give the same `ResolvedModel`. Weight bytes always come from the checkpoint's
own metadata (the safetensors index's `total_size`, or the safetensors headers), never
from a parameter-count guess and never by downloading weights.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launcher.errors import ModelConfigError, ModelNotFound
from launcher.model import ModelGeometry, geometry_from_config
from launcher.paths import load_yaml, profiles_dir

INDEX_FILE = "model.safetensors.index.json"
_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors caps its JSON header at 100 MB


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # what the engine is given (repo id or path)
    source: str  # "alias", "local" or "hub"
    geometry: ModelGeometry
    weight_bytes: int
    weight_bytes_source: str
    config: Mapping[str, Any]
    alias: str | None = None
    repo_id: str | None = None
    path: str | None = None
    quantized_variants: tuple[str, ...] = ()


def resolve_model(text: str, *, env: Mapping[str, str] | None = None) -> ResolvedModel:
    """Resolve a model by local directory, then alias, then Hugging Face repo id."""
    env = os.environ if env is None else env
    path = Path(text).expanduser()
    if path.is_dir():
        return _from_local_dir(path, text)
    profile = load_profile(text)
    if profile is not None:
        return model_from_profile(profile)
    if "/" in text and not text.startswith((".", "/", "~")):
        return _from_hub(text, env)
    known = ", ".join(sorted(list_aliases()))
    raise ModelNotFound(
        f"model {text!r} is not a directory, a known alias or a Hugging Face repo id",
        hint=f"aliases: {known}",
    )


# --------------------------------------------------------------------------- aliases


def list_aliases() -> list[str]:
    return [p.stem for p in sorted((profiles_dir() / "models").glob("*.yaml"))]


def load_profile(alias: str) -> Mapping[str, Any] | None:
    """The profile for an alias (case-insensitive), or for a repo id a profile names."""
    wanted = alias.lower()
    models = profiles_dir() / "models"
    candidate = models / f"{wanted}.yaml"
    if candidate.is_file():
        return _read_yaml(candidate)
    return None


def profile_for_repo(repo_id: str) -> Mapping[str, Any] | None:
    for path in sorted((profiles_dir() / "models").glob("*.yaml")):
        data = _read_yaml(path)
        if str(data.get("repo", "")).lower() == repo_id.lower():
            return data
    return None


def _read_yaml(path: Path) -> Mapping[str, Any]:
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as exc:
        raise ModelConfigError(f"{path}: not valid YAML ({exc.__class__.__name__})") from None
    if not isinstance(data, Mapping):
        raise ModelConfigError(f"{path}: expected a mapping")
    return data


def model_from_profile(profile: Mapping[str, Any], *, via: str = "alias") -> ResolvedModel:
    config = profile.get("config")
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"profile {profile.get('alias')!r}: missing its 'config' mapping")
    weight_bytes = profile.get("weight_bytes")
    if not isinstance(weight_bytes, int) or weight_bytes <= 0:
        raise ModelConfigError(f"profile {profile.get('alias')!r}: 'weight_bytes' must be a positive integer")
    return ResolvedModel(
        name=str(profile.get("repo") or profile.get("alias")),
        source=via,
        geometry=geometry_from_config(config),
        weight_bytes=weight_bytes,
        weight_bytes_source=f"profile {profile.get('alias')}: {profile.get('weight_bytes_source', 'checkpoint size')}",
        config=config,
        alias=str(profile.get("alias")),
        repo_id=profile.get("repo"),
        quantized_variants=tuple(profile.get("quantized_variants") or ()),
    )


# --------------------------------------------------------------------------- local directory


def _from_local_dir(path: Path, text: str) -> ResolvedModel:
    config = read_config_file(path / "config.json")
    weight_bytes, source = weight_bytes_in_dir(path)
    return ResolvedModel(
        name=text, source="local", geometry=geometry_from_config(config), weight_bytes=weight_bytes,
        weight_bytes_source=source, config=config, path=str(path),
    )


def read_config_file(path: Path) -> Mapping[str, Any]:
    if not path.is_file():
        raise ModelNotFound(f"{path} not found: a model directory needs its config.json")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise ModelConfigError(f"{path}: expected a JSON object")
    return data


def weight_bytes_in_dir(path: Path) -> tuple[int, str]:
    """Checkpoint tensor bytes: the index's total_size, else the safetensors headers."""
    index = path / INDEX_FILE
    if index.is_file():
        total = total_size_from_index(_read_json(index), str(index))
        return total, f"{INDEX_FILE} total_size"
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        return sum(safetensors_tensor_bytes(s) for s in shards), f"headers of {len(shards)} safetensors file(s)"
    raise ModelConfigError(f"{path}: no *.safetensors files or {INDEX_FILE} to read the weight size from")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc})") from None


def total_size_from_index(index: Any, where: str) -> int:
    total = index.get("metadata", {}).get("total_size") if isinstance(index, Mapping) else None
    if not isinstance(total, (int, float)) or total <= 0:
        raise ModelConfigError(f"{where}: no metadata.total_size")
    return int(total)


def safetensors_tensor_bytes(path: Path) -> int:
    """Sum of tensor byte ranges from a safetensors header, without reading tensors."""
    with path.open("rb") as handle:
        raw_len = handle.read(8)
        if len(raw_len) != 8:
            raise ModelConfigError(f"{path}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > _HEADER_LIMIT:
            raise ModelConfigError(f"{path}: safetensors header of {header_len} bytes is not plausible")
        try:
            header = json.loads(handle.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelConfigError(f"{path}: unreadable safetensors header") from None
    return tensor_bytes_from_header(header, str(path))


def tensor_bytes_from_header(header: Any, where: str) -> int:
    if not isinstance(header, Mapping):
        raise ModelConfigError(f"{where}: safetensors header is not a JSON object")
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, Mapping) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise ModelConfigError(f"{where}: tensor {name!r} has no valid data_offsets")
        total += offsets[1] - offsets[0]
    return total


# --------------------------------------------------------------------------- Hugging Face Hub


def _from_hub(repo_id: str, env: Mapping[str, str]) -> ResolvedModel:
    """Read config.json and the weight size through huggingface_hub (cache, offline, token).

    huggingface_hub itself honours HF_HOME, HF_HUB_OFFLINE and HF_TOKEN; we never log the token.
    When the hub cannot be reached and a profile names this repo, plan from the profile.
    """
    from huggingface_hub import hf_hub_download  # imported late: it is slow to import
    from huggingface_hub.errors import (
        EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
    )

    token = env.get("HF_TOKEN") or None
    try:
        config = read_config_file(Path(hf_hub_download(repo_id, "config.json", token=token)))
    except (GatedRepoError,) as exc:
        raise ModelNotFound(f"{repo_id}: gated repository; set HF_TOKEN with access", hint=type(exc).__name__) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{repo_id}: no such repository on the Hugging Face Hub (or no access)") from None
    except (LocalEntryNotFoundError, OSError) as exc:
        profile = profile_for_repo(repo_id)
        if profile is not None:
            return model_from_profile(profile, via="alias")
        raise ModelNotFound(
            f"{repo_id}: config.json is not in the Hugging Face cache and the hub cannot be reached",
            hint="download it once online, or pass a local directory",
        ) from exc
    except EntryNotFoundError:
        raise ModelNotFound(f"{repo_id}: the repository has no config.json") from None

    weight_bytes, source = _hub_weight_bytes(repo_id, token)
    profile = profile_for_repo(repo_id)
    return ResolvedModel(
        name=repo_id, source="hub", geometry=geometry_from_config(config), weight_bytes=weight_bytes,
        weight_bytes_source=source, config=config, repo_id=repo_id,
        quantized_variants=tuple((profile or {}).get("quantized_variants") or ()),
    )


def _hub_weight_bytes(repo_id: str, token: str | None) -> tuple[int, str]:
    from huggingface_hub import get_safetensors_metadata, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        index_path = hf_hub_download(repo_id, INDEX_FILE, token=token)
        total = total_size_from_index(_read_json(Path(index_path)), f"{repo_id}/{INDEX_FILE}")
        return total, f"{repo_id} {INDEX_FILE} total_size"
    except (EntryNotFoundError, LocalEntryNotFoundError, OSError):
        pass
    try:
        meta = get_safetensors_metadata(repo_id, token=token)  # range reads of the headers only
    except Exception as exc:  # the hub raises several unrelated types here
        raise ModelConfigError(f"{repo_id}: cannot read the safetensors headers ({type(exc).__name__})") from None
    total = 0
    for file_meta in meta.files_metadata.values():
        total += sum(t.data_offsets[1] - t.data_offsets[0] for t in file_meta.tensors.values())
    return total, f"{repo_id} safetensors headers"
