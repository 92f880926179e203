"""Turn what the operator typed into a model: an alias, a local directory or a Hugging Face id.

All three give the same `ResolvedModel`. Weight bytes always come from the checkpoint's
own metadata (the safetensors index's `total_size`, or the safetensors headers; for a `.bin`
checkpoint its index's `total_size`, else the files' sizes on disk), never from a
parameter-count guess and never by downloading weights. A `.bin` is a pickle: it is never
opened for reading, let alone loaded (no torch.load); only its size is taken.

Everything read here is untrusted: files are opened only if they are regular files (a FIFO
would block the plan forever), JSON is size- and depth-bounded, and every value is checked
before arithmetic. Each failure is one line: 66 for what cannot be found or opened, 65 for
what is there but malformed, 75 for a Hub that does not answer (temporary).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from launcher.common.errors import ModelConfigError, ModelNotFound, TemporarilyUnavailable, UnsizedWeights
from launcher.common.paths import load_yaml, profiles_dir
from launcher.model.config import ModelGeometry, geometry_from_config
from launcher.model.draft import DraftModules, draft_names, mtp_layer_range, summarize

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"
BIN_SINGLE_FILE = "pytorch_model.bin"
# Without safetensors both engines load every *.bin but the trainer's files: vLLM
# model_loader/default_loader.py:186 and :229 (glob "*.safetensors", then "*.bin"),
# weight_utils.py:614 filter_files_not_needed_for_inference; SGLang 0.5.23
# model_loader/loader.py:500 and weight_utils.py:868, the same rule.
_NOT_WEIGHTS = frozenset({"training_args.bin", "optimizer.bin"})
BIN_SIZES_CAVEAT = "pickles, not opened: their size bounds the tensor bytes from above"
UNSIZED_HINT = "--trust-engine starts it anyway and the engine sizes the weights itself"
_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors caps its JSON header at 100 MB
_JSON_LIMIT = 64 * 1024 * 1024  # config.json and indexes are kilobytes; a larger one is not a config
_MAX_TOTAL_SIZE = 1 << 50  # 1 PiB: beyond any checkpoint, so a typo in total_size is not planned
_MAX_ARG = 4096  # PATH_MAX: a longer model argument names nothing
_MAX_DRAFT_SHARDS = 16  # MTP layers sit in a few shards; more is no MTP stack worth a header read each

# huggingface_hub's own rule (utils/_validators.py REPO_ID_REGEX, ASCII only, 96 characters).
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9_.\-]{1,96}/)?[A-Za-z0-9_.\-]{1,96}$")
_ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")

# Hub calls: a short, bounded retry, so an outage costs seconds and exits 75 (temporary),
# instead of huggingface_hub's own 60 s etag retry with backoff when nothing is cached.
HUB_TIMEOUT_S = 4.0
HUB_TRIES = 2
_HUB_RETRY_WAIT_S = 0.5


@dataclass(frozen=True)
class ResolvedModel:
    """A model as the planner needs it: its KV geometry and the checkpoint's real weight bytes.

    `weight_bytes_source` says where the bytes come from (an index's total_size, the tensor
    headers, .bin file sizes on disk, or a profile's figure computed from config shapes);
    nothing is guessed from a parameter count. `weights_sized` is False only when the caller
    allowed an unsized checkpoint (--trust-engine): then `weight_bytes` is 0 and the source
    says why, and the planner refuses to plan it (the engine sizes it).
    """

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
    weights_sized: bool = True
    # The MTP (next-n) tensors the checkpoint holds beside the model, counted in `weight_bytes`: the
    # engines' main model does not load them (launcher.model.draft); None where there are none.
    draft: DraftModules | None = None


def resolve_model(text: str, *, env: Mapping[str, str] | None = None, unsized_ok: bool = False) -> ResolvedModel:
    """Resolve a model by local directory, then alias, then Hugging Face repo id.

    `unsized_ok` (--trust-engine): a checkpoint whose weight bytes cannot be read is returned
    with `weights_sized=False` instead of raising `UnsizedWeights`.
    """
    env = os.environ if env is None else env
    if not text or len(text) > _MAX_ARG or "\0" in text:
        raise ModelNotFound(f"model {_shown(text)}: not a usable name or path ({len(text)} characters)")
    if _is_dir(_expand(text)):
        return _from_local_dir(_expand(text), text, unsized_ok=unsized_ok)
    profile = load_profile(text)
    if profile is not None:
        return model_from_profile(profile)
    if "/" in text and not text.startswith((".", "/", "~")) and is_repo_id(text):
        return _from_hub(text, env, unsized_ok=unsized_ok)
    raise ModelNotFound(
        f"model {_shown(text)} is not a directory, a known alias or a Hugging Face repo id",
        hint=_alias_hint(text, sorted(list_aliases())),
    )


def _alias_hint(text: str, aliases: Sequence[str]) -> str:
    """`did you mean qwen2.5-7b` for `qwen2.5-7`, `llama3.1-8b` or `qwen2.5:7b` (difflib on the aliases)."""
    import difflib

    typed = text.strip().lower().replace(":", "-").replace("_", "-")
    close = difflib.get_close_matches(typed, aliases, n=3, cutoff=0.75)
    if close:
        return "did you mean " + " or ".join(close) + " (safe-serve models lists them all)"
    return f"repo ids are namespace/name in ASCII letters, digits, - _ . ; aliases: {', '.join(aliases)}"


def is_repo_id(text: str) -> bool:
    """What huggingface_hub's validate_repo_id accepts, checked here so it never raises at us."""
    return bool(_REPO_ID.match(text)) and "--" not in text and ".." not in text and not text.endswith(".git") \
        and not any(part[:1] in "-." or part[-1:] in "-." for part in text.split("/"))


def _expand(text: str) -> Path:
    """`~/models/x` -> the home directory's; `~nosuchuser/x` is one line, not a RuntimeError."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        raise ModelNotFound(f"model {_shown(text)}: no such user's home directory") from None


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES: the operator named a path we cannot use
        if exc.errno == errno.ENAMETOOLONG:
            raise ModelNotFound(f"model {_shown(str(path))}: the name is too long for the file system") from None
        raise ModelNotFound(f"model {_shown(str(path))}: cannot open it ({exc.strerror or exc})") from None
    except ValueError:  # an embedded NUL byte
        return False


def _shown(text: str) -> str:
    """A name for an error line, cut short: one line even for a 10,000-character argument."""
    return repr(text if len(text) <= 80 else f"{text[:80]}...")


# --------------------------------------------------------------------------- aliases


def list_aliases() -> list[str]:
    return [p.stem for p in sorted((profiles_dir() / "models").glob("*.yaml"))]


def load_profile(alias: str) -> Mapping[str, Any] | None:
    """The profile for an alias (case-insensitive), or for a repo id a profile names."""
    if not _ALIAS.match(alias):
        return None  # never a path: `../x` or a 300-character name must not reach the file system
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


def _from_local_dir(path: Path, text: str, *, unsized_ok: bool) -> ResolvedModel:
    config_path = path / "config.json"
    config = read_config_file(config_path)
    weight_bytes, source, sized = _sized_or_not(lambda: weight_bytes_in_dir(path), unsized_ok)
    geometry = _geometry(config, config_path)
    return ResolvedModel(
        name=text, source="local", geometry=geometry, weight_bytes=weight_bytes,
        weight_bytes_source=source, config=config, path=engine_path(path), weights_sized=sized,
        draft=draft_in_dir(path, geometry) if sized else None,
    )


def _sized_or_not(size: Any, unsized_ok: bool) -> tuple[int, str, bool]:
    """(bytes, source, True) from `size()`; with `unsized_ok`, (0, why not, False) where it
    raises UnsizedWeights."""
    try:
        weight_bytes, source = size()
    except UnsizedWeights as exc:
        if not unsized_ok:
            raise
        return 0, f"unknown: {exc.message}", False
    return weight_bytes, source, True


def engine_path(path: Path) -> str:
    """The directory as the engine gets it: absolute, or `./`-prefixed, so that no directory name
    (`./--served-model-name`) can reach the engine's parser as a flag."""
    text = str(path)
    return text if path.is_absolute() else f".{os.sep}{text}"


def _geometry(config: Mapping[str, Any], where: Path) -> ModelGeometry:
    """geometry_from_config, its error naming the real file instead of a bare config.json."""
    try:
        return geometry_from_config(config)
    except ModelConfigError as exc:
        raise ModelConfigError(f"{where}: {exc.message.removeprefix('config.json: ')}", hint=exc.hint) from None


def read_config_file(path: Path) -> Mapping[str, Any]:
    data = _read_json(path, missing=f"{path.parent}: no config.json there (a model directory needs one)")
    if not isinstance(data, Mapping):
        raise ModelConfigError(f"{path}: expected a JSON object")
    return data


def weight_bytes_in_dir(path: Path) -> tuple[int, str]:
    """Checkpoint tensor bytes: the index's total_size, else the safetensors headers, else the
    .bin checkpoint's (its index's total_size, else its files' sizes); the engines' own order."""
    index = path / INDEX_FILE
    if os.path.lexists(index):
        total = total_size_from_index(_read_json(index, missing=f"{index}: not found"), str(index))
        return total, f"{INDEX_FILE} total_size"
    shards = _listed(path, "*.safetensors")
    if shards:
        return sum(safetensors_tensor_bytes(s) for s in shards), f"headers of {len(shards)} safetensors file(s)"
    found = _bin_weight_bytes_in_dir(path)
    if found is None:
        raise UnsizedWeights(f"{path}: no *.safetensors, *.bin or {INDEX_FILE} to read the weight size from",
                             hint=UNSIZED_HINT)
    return found


def _bin_weight_bytes_in_dir(path: Path) -> tuple[int, str] | None:
    """A .bin checkpoint: its index's total_size where it states one, else the files' sizes."""
    bin_index = path / BIN_INDEX_FILE
    if os.path.lexists(bin_index):
        total = optional_total_size(_read_json(bin_index), str(bin_index))
        if total is not None:
            return total, f"{BIN_INDEX_FILE} total_size"
    pickles = [f for f in _listed(path, "*.bin") if f.name not in _NOT_WEIGHTS]
    if not pickles:
        return None
    return sum(stored_size(f) for f in pickles), f"sizes of {len(pickles)} .bin file(s) on disk ({BIN_SIZES_CAVEAT})"


# --------------------------------------------------------------------------- MTP tensors


def draft_in_dir(path: Path, geometry: ModelGeometry) -> DraftModules | None:
    """The MTP tensors of a local checkpoint: named by its index (sized from the shards that hold them,
    where they are here) or by its safetensors headers."""
    layers = mtp_layer_range(geometry.text_config, geometry.num_layers)
    index = path / INDEX_FILE
    if os.path.lexists(index):
        return draft_from_index(_read_json(index), layers, lambda shard: _header_sizes(path / shard))
    sizes: dict[str, int] = {}
    for shard in _listed(path, "*.safetensors"):
        found = _header_sizes(shard)
        if found is None:
            return None
        sizes.update(found)
    return summarize(draft_names(sizes, layers), sizes)


def draft_from_index(index: Any, layers: range,
                     shard_sizes: Callable[[str], Mapping[str, int] | None]) -> DraftModules | None:
    """The MTP tensors an index's weight_map names, with their bytes from the headers of the shards
    holding them (`shard_sizes`; None for a shard that cannot be read, and then the bytes are unknown)."""
    weight_map = index.get("weight_map") if isinstance(index, Mapping) else None
    if not isinstance(weight_map, Mapping):
        return None
    kinds = draft_names(weight_map, layers)
    if not kinds:
        return None
    shards = [weight_map[name] for name in kinds]
    if not all(_plain_shard_name(shard) for shard in shards) or len(set(shards)) > _MAX_DRAFT_SHARDS:
        return summarize(kinds, None)
    sizes: dict[str, int] = {}
    for shard in sorted(set(shards)):
        found = shard_sizes(shard)
        if found is None:
            return summarize(kinds, None)
        sizes.update(found)
    return summarize(kinds, sizes)


def _plain_shard_name(name: Any) -> bool:
    """A file name in the checkpoint's own directory, as the engines join it: no path, no parent."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and name.endswith(".safetensors")
            and "/" not in name and "\\" not in name and "\0" not in name and not name.startswith("."))


def _header_sizes(path: Path) -> dict[str, int] | None:
    """A shard's tensor sizes, or None where it is not here or not readable (its MTP bytes stay counted)."""
    if not os.path.lexists(path):
        return None
    try:
        return safetensors_tensor_sizes(path)
    except (ModelConfigError, ModelNotFound):
        return None


def _listed(path: Path, pattern: str) -> list[Path]:
    try:
        return sorted(path.glob(pattern))
    except OSError as exc:
        raise ModelNotFound(f"{path}: cannot list it ({exc.strerror or exc})") from None


def stored_size(path: Path) -> int:
    """A weight file's size on disk, from fstat of the opened file: nothing is read (a .bin is
    an untrusted pickle), and a FIFO or a directory under the name is refused as for any file."""
    with _open_regular(path, f"{path}: not found") as handle:
        return os.fstat(handle.fileno()).st_size


def _open_regular(path: Path, missing: str) -> IO[bytes]:
    """Open a file we must read, only if it is a regular file.

    O_NONBLOCK makes opening a FIFO return at once (a plain open waits for a writer forever);
    fstat on the open descriptor then refuses it, with no window for a swap after a stat.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.islink(path):
            target = os.readlink(path)
            raise ModelNotFound(f"{path}: a dangling symlink (its target {target!r} does not exist)") from None
        raise ModelNotFound(missing) from None
    except OSError as exc:  # ELOOP (a symlink loop), EACCES, ENAMETOOLONG, ENOTDIR
        raise ModelNotFound(f"{path}: cannot open it ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ModelConfigError(f"{path}: is {_file_kind(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a plain file"


def _read_json(path: Path, missing: str | None = None) -> Any:
    """Parse a small JSON file: regular, at most 64 MiB, not nested beyond Python's recursion limit."""
    with _open_regular(path, missing or f"{path}: not found") as handle:
        raw = handle.read(_JSON_LIMIT + 1)
    if len(raw) > _JSON_LIMIT:
        raise ModelConfigError(f"{path}: larger than {_JSON_LIMIT >> 20} MiB, not a config file")
    return _parse_json(raw, str(path))


def _parse_json(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise ModelConfigError(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise ModelConfigError(f"{where}: not valid JSON ({_one_line(exc)})") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else f"{text[:160]}..."


def total_size_from_index(index: Any, where: str) -> int:
    total = optional_total_size(index, where, required=True)
    if total is None:  # `required` has raised already; this keeps the type an int
        raise ModelConfigError(f"{where}: no metadata.total_size")
    return total


def optional_total_size(index: Any, where: str, *, required: bool = False) -> int | None:
    """An index's metadata.total_size; None where the index states none (and it is not `required`).
    A value that is there but not a byte count is always an error: it would be planned."""
    if not isinstance(index, Mapping):
        raise ModelConfigError(f"{where}: expected a JSON object")
    metadata = index.get("metadata")
    if metadata is None and not required:
        return None
    if not isinstance(metadata, Mapping):
        raise ModelConfigError(f"{where}: 'metadata' must be an object holding total_size, not {_value(metadata)}")
    total = metadata.get("total_size")
    if total is None:
        if not required:
            return None
        raise ModelConfigError(f"{where}: no metadata.total_size")
    if not _whole(total) or not 0 < total <= _MAX_TOTAL_SIZE:
        raise ModelConfigError(
            f"{where}: metadata.total_size must be a byte count from 1 to 2**50, not {_value(total)}")
    return int(total)


def _whole(value: Any) -> bool:
    """A JSON integer (or an integral float, as some writers emit): not bool, NaN, inf or 10**400."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer()


def _value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


def safetensors_tensor_bytes(path: Path) -> int:
    """Sum of tensor byte ranges from a safetensors header, without reading tensors."""
    return sum(safetensors_tensor_sizes(path).values())


def safetensors_tensor_sizes(path: Path) -> dict[str, int]:
    """{tensor name: bytes} from a safetensors header, without reading tensors; checked as
    safetensors checks it."""
    with _open_regular(path, f"{path}: not found") as handle:
        raw_len = handle.read(8)
        if len(raw_len) != 8:
            raise ModelConfigError(f"{path}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > _HEADER_LIMIT:
            raise ModelConfigError(f"{path}: safetensors header of {header_len} bytes is not plausible")
        raw = handle.read(header_len)
        data_held = os.fstat(handle.fileno()).st_size - 8 - header_len
    if len(raw) != header_len:
        raise ModelConfigError(f"{path}: safetensors header cut short ({len(raw)} of {header_len} bytes)")
    try:
        header = _parse_json(raw, str(path))
    except ModelConfigError:
        raise ModelConfigError(f"{path}: unreadable safetensors header") from None
    sizes = tensor_sizes_from_header(header, str(path))
    data_end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    if data_end > data_held:  # safetensors refuses it too (MetadataIncompleteBuffer); the engine would, after loading
        raise ModelConfigError(f"{path}: cut short: its header places tensor data up to byte {data_end} "
                               f"and the file holds {data_held} (an incomplete download?)")
    return sizes


def tensor_sizes_from_header(header: Any, where: str) -> dict[str, int]:
    if not isinstance(header, Mapping):
        raise ModelConfigError(f"{where}: safetensors header is not a JSON object")
    sizes: dict[str, int] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, Mapping) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= _MAX_TOTAL_SIZE):
            raise ModelConfigError(f"{where}: tensor {_value(name)} has no valid data_offsets")
        _check_tensor_size(entry, offsets[1] - offsets[0], f"{where}: tensor {_value(name)}")
        sizes[str(name)] = offsets[1] - offsets[0]
    return sizes


# Bits per element of the safetensors dtypes (safetensors' Dtype::bitsize); another dtype is taken at its offsets.
_DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
               "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
               "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def _check_tensor_size(entry: Mapping[str, Any], span: int, what: str) -> None:
    """The bytes a tensor's dtype and shape need are the bytes its offsets span (safetensors checks the
    same, TensorInvalidInfo): a header that says otherwise is not planned from its offsets."""
    bits, shape = _DTYPE_BITS.get(str(entry.get("dtype"))), entry.get("shape")
    if bits is None or not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        return
    elements = 1
    for dim in shape:
        elements *= dim
    if elements * bits != span * 8:
        raise ModelConfigError(f"{what} of dtype {entry['dtype']} and shape {_value(shape)} needs "
                               f"{elements * bits // 8} bytes, its data_offsets span {span}")


# --------------------------------------------------------------------------- Hugging Face Hub


class _NotCached(Exception):
    """Offline, and the file is not in the Hugging Face cache."""


def _from_hub(repo_id: str, env: Mapping[str, str], *, unsized_ok: bool) -> ResolvedModel:
    """Read config.json and the weight size through huggingface_hub (cache, offline, token).

    huggingface_hub itself honours HF_HOME, HF_HUB_CACHE and HF_TOKEN; we never log the token.
    Cached files are read without a network call when offline (HF_HUB_OFFLINE=1). When the hub
    cannot be reached and a profile names this repo, plan from the profile.
    """
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    token = env.get("HF_TOKEN") or None
    offline = _offline(env)
    try:
        config_path = _hub_small_file(repo_id, "config.json", token, offline=offline)
    except GatedRepoError as exc:
        raise ModelNotFound(f"{repo_id}: gated repository; set HF_TOKEN with access", hint=type(exc).__name__) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{repo_id}: no such repository on the Hugging Face Hub (or no access)") from None
    except (_NotCached, TemporarilyUnavailable) as exc:
        profile = profile_for_repo(repo_id)
        if profile is not None:
            return model_from_profile(profile, via="alias")
        if isinstance(exc, TemporarilyUnavailable):
            raise
        raise ModelNotFound(
            f"{repo_id}: config.json is not in the Hugging Face cache and HF_HUB_OFFLINE is set",
            hint="download it once online, or pass a local directory",
        ) from None
    except HfHubHTTPError as exc:
        raise ModelNotFound(f"{repo_id}: the Hugging Face Hub refused ({_http_status(exc)})") from None
    if config_path is None:
        raise ModelNotFound(f"{repo_id}: the repository has no config.json")
    config = read_config_file(config_path)
    weight_bytes, source, sized = _sized_or_not(lambda: _hub_weight_bytes(repo_id, token, offline=offline),
                                                unsized_ok)
    profile = profile_for_repo(repo_id)
    geometry = _geometry(config, Path(f"{repo_id}/config.json"))
    return ResolvedModel(
        name=repo_id, source="hub", geometry=geometry,
        weight_bytes=weight_bytes, weight_bytes_source=source, config=config, repo_id=repo_id,
        quantized_variants=tuple((profile or {}).get("quantized_variants") or ()), weights_sized=sized,
        draft=_hub_draft(repo_id, geometry, token, offline=offline) if sized else None,
    )


def _offline(env: Mapping[str, str]) -> bool:
    from huggingface_hub import constants

    def truthy(value: str | None) -> bool:
        return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")

    return bool(constants.HF_HUB_OFFLINE) or truthy(env.get("HF_HUB_OFFLINE")) \
        or truthy(env.get("TRANSFORMERS_OFFLINE"))


def _cached(repo_id: str, filename: str) -> tuple[Path | None, bool]:
    """(the cached file, or None; whether the cache knows the repo has no such file)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename)
    except (OSError, ValueError):  # an unreadable cache is no cache
        return None, False
    if isinstance(found, str):
        return Path(found), False
    return None, found is not None  # _CACHED_NO_EXIST: a 404 was cached


def _hub_small_file(repo_id: str, filename: str, token: str | None, *, offline: bool) -> Path | None:
    """A small file of the repo (config.json, the index): cached, else fetched with a bounded retry.

    None when the repo has no such file. Raises TemporarilyUnavailable when the Hub does not answer
    and nothing is cached, _NotCached when offline and nothing is cached.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError

    cached, known_missing = _cached(repo_id, filename)
    if offline:
        if cached is not None:
            return cached
        if known_missing:
            return None
        raise _NotCached(filename)
    # A HEAD with our timeout first: hf_hub_download retries for 60 s when nothing is cached.
    try:
        _with_retry(lambda: get_hf_file_metadata(hf_hub_url(repo_id, filename), token=token, timeout=HUB_TIMEOUT_S),
                    repo_id)
        return Path(_with_retry(lambda: hf_hub_download(repo_id, filename, token=token, etag_timeout=HUB_TIMEOUT_S),
                                repo_id))
    except EntryNotFoundError:
        return None
    except TemporarilyUnavailable:
        if cached is not None:
            return cached  # the Hub is down; the cached copy is what it last said
        raise


def _hub_weight_bytes(repo_id: str, token: str | None, *, offline: bool) -> tuple[int, str]:
    """The safetensors index's total_size, else the single file's header, else the .bin
    checkpoint's size: from the cache when they are there, else from the Hub's metadata."""
    from huggingface_hub import get_safetensors_metadata
    from huggingface_hub.errors import HfHubHTTPError, NotASafetensorsRepoError

    cached = _cached_weight_bytes(repo_id)
    if cached is not None:
        return cached
    if offline:
        raise ModelNotFound(
            f"{repo_id}: HF_HUB_OFFLINE is set and neither {INDEX_FILE} nor {SINGLE_FILE} "
            f"(nor {BIN_INDEX_FILE} or {BIN_SINGLE_FILE}) is in the Hugging Face cache",
            hint="download the index (or the single file) once online")
    try:
        index = _hub_small_file(repo_id, INDEX_FILE, token, offline=False)
        if index is not None:
            total = total_size_from_index(_read_json(index), f"{repo_id}/{INDEX_FILE}")
            return total, f"{repo_id} {INDEX_FILE} total_size"
        # Range reads of the headers only, never the weights.
        meta = _with_retry(lambda: get_safetensors_metadata(repo_id, token=token, timeout=HUB_TIMEOUT_S), repo_id)
    except NotASafetensorsRepoError:
        return _hub_bin_weight_bytes(repo_id, token)
    except HfHubHTTPError as exc:
        raise ModelConfigError(f"{repo_id}: cannot read the safetensors headers ({_http_status(exc)})") from None
    total = 0
    for file_meta in meta.files_metadata.values():
        total += sum(t.data_offsets[1] - t.data_offsets[0] for t in file_meta.tensors.values())
    return total, f"{repo_id} safetensors headers"


def _cached_weight_bytes(repo_id: str) -> tuple[int, str] | None:
    """What the Hugging Face cache alone says, in the engines' order: safetensors, then .bin."""
    index, _ = _cached(repo_id, INDEX_FILE)
    if index is not None:
        return total_size_from_index(_read_json(index), f"{repo_id}/{INDEX_FILE}"), f"{repo_id} {INDEX_FILE} total_size"
    single, _ = _cached(repo_id, SINGLE_FILE)
    if single is not None:  # the same header reader as for a local directory, no network
        return safetensors_tensor_bytes(single), f"{repo_id} {SINGLE_FILE} header (cached)"
    bin_index, _ = _cached(repo_id, BIN_INDEX_FILE)
    total = optional_total_size(_read_json(bin_index), f"{repo_id}/{BIN_INDEX_FILE}") if bin_index else None
    if total is not None:
        return total, f"{repo_id} {BIN_INDEX_FILE} total_size"
    single_bin, _ = _cached(repo_id, BIN_SINGLE_FILE)
    if single_bin is not None:  # the cache's blob, sized by fstat, never read
        return stored_size(single_bin), f"{repo_id} {BIN_SINGLE_FILE} size on disk (cached; {BIN_SIZES_CAVEAT})"
    return None


def _hub_draft(repo_id: str, geometry: ModelGeometry, token: str | None, *, offline: bool) -> DraftModules | None:
    """The MTP tensors the cached index names, sized from the shards' headers: cached shards read here,
    others by a range read of their header on the Hub (never the weights); unknown bytes offline."""
    index, _ = _cached(repo_id, INDEX_FILE)
    if index is None:
        return None

    def shard_sizes(shard: str) -> Mapping[str, int] | None:
        cached, _ = _cached(repo_id, shard)
        if cached is not None:
            return _header_sizes(cached)
        return None if offline else _hub_header_sizes(repo_id, shard, token)

    return draft_from_index(_read_json(index), mtp_layer_range(geometry.text_config, geometry.num_layers),
                            shard_sizes)


def _hub_header_sizes(repo_id: str, shard: str, token: str | None) -> dict[str, int] | None:
    """One shard's tensor sizes from its header on the Hub (two range reads), or None if it cannot be read.
    The header is a stranger's JSON: whatever huggingface_hub's parser makes of it, a failure or a value that is
    not a pair of offsets leaves the MTP bytes counted (the safe side), never a traceback."""
    from huggingface_hub import HfApi

    try:
        meta = _with_retry(lambda: HfApi().parse_safetensors_file_metadata(
            repo_id, shard, token=token, timeout=HUB_TIMEOUT_S), repo_id)
        sizes: dict[str, int] = {}
        for name, info in meta.tensors.items():
            start, end = info.data_offsets
            if not (type(start) is int and type(end) is int and 0 <= start <= end <= _MAX_TOTAL_SIZE):
                return None
            sizes[str(name)] = end - start
    except Exception:  # noqa: BLE001 - network, parsing, recursion, shapes: any of them means "not sized"
        return None
    return sizes


def _hub_bin_weight_bytes(repo_id: str, token: str | None) -> tuple[int, str]:
    """A repo without safetensors: its .bin index's total_size, else pytorch_model.bin's size
    as the Hub states it (a HEAD request; the file is not downloaded)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    try:
        bin_index = _hub_small_file(repo_id, BIN_INDEX_FILE, token, offline=False)
        total = optional_total_size(_read_json(bin_index), f"{repo_id}/{BIN_INDEX_FILE}") if bin_index else None
        if total is not None:
            return total, f"{repo_id} {BIN_INDEX_FILE} total_size"
        meta = _with_retry(lambda: get_hf_file_metadata(hf_hub_url(repo_id, BIN_SINGLE_FILE), token=token,
                                                        timeout=HUB_TIMEOUT_S), repo_id)
    except EntryNotFoundError:
        meta = None
    except HfHubHTTPError as exc:
        raise ModelConfigError(f"{repo_id}: cannot read the .bin checkpoint's metadata ({_http_status(exc)})") from None
    if meta is not None and isinstance(meta.size, int) and 0 < meta.size <= _MAX_TOTAL_SIZE:
        return meta.size, f"{repo_id} {BIN_SINGLE_FILE} size on the Hub ({BIN_SIZES_CAVEAT})"
    raise UnsizedWeights(
        f"{repo_id}: no safetensors weights, and neither a {BIN_INDEX_FILE} total_size nor a {BIN_SINGLE_FILE} "
        "to size", hint=UNSIZED_HINT)


def _with_retry(call: Any, repo_id: str) -> Any:
    """Call the Hub up to HUB_TRIES times on network errors; then one TemporarilyUnavailable (75)."""
    last: BaseException | None = None
    for attempt in range(HUB_TRIES):
        if attempt:
            time.sleep(_HUB_RETRY_WAIT_S)
        try:
            return call()
        except Exception as exc:
            if not _transient(exc):
                raise
            last = exc
    raise TemporarilyUnavailable(
        f"{repo_id}: the Hugging Face Hub is unavailable ({HUB_TRIES} tries, {HUB_TIMEOUT_S:g} s timeout each; "
        f"{type(last).__name__}: {_one_line(last) if last else ''})",
        hint="a network outage is temporary: try again later, or set HF_HUB_OFFLINE=1 to use the cache")


def _transient(exc: BaseException) -> bool:
    """Network failures and the Hub's own 429/5xx: worth a retry, and temporary if they persist."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return False
    if isinstance(exc, HfHubHTTPError):
        status = _http_status(exc)
        return status is None or status == 429 or status >= 500
    if isinstance(exc, (LocalEntryNotFoundError, ConnectionError, TimeoutError)):
        return True
    # httpx (huggingface_hub >= 1) and requests (older) name their network errors so.
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"TransportError", "TimeoutException", "ConnectionError", "Timeout", "ProxyError"})


def _http_status(exc: BaseException) -> Any:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)
