"""`--config FILE`: a command's options as a YAML mapping, as vLLM's `--config` takes them.

    # /etc/safe-serve/qwen.yaml
    model: Qwen/Qwen2.5-7B-Instruct
    engine: vllm
    max-gpu-memory: 40GiB
    concurrency: 4
    engine-args: [--max-model-len, "8192", --port, "8000"]

Keys are the long option names (dashes or underscores); `engine-args` is the list after `--`.
The command line and the SAFE_SERVE_* variables win over the file (click's default_map).
A missing file is exit 66, anything else wrong with it exit 2 naming the key.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

from launcher.common.errors import ModelNotFound, UsageError

# click parameter names that are spelled differently on the command line.
_ALIASES = {"gpu": "gpu_specs", "json": "as_json"}
MAX_CONFIG_BYTES = 1 << 20


def load_config(path: str, names: Sequence[str]) -> dict[str, object]:
    """{click parameter name: value} from the YAML mapping at `path`, for a command taking `names`."""
    from launcher.common.paths import load_yaml

    file = Path(path)
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ModelNotFound(f"--config {path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read it ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageError(f"--config {path}: larger than 1 MiB, not a settings file")
    import yaml

    try:
        doc = load_yaml(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"--config {path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:  # one line, not a traceback
        raise UsageError(f"--config {path}: not valid YAML ({(str(exc).splitlines() or ['?'])[0][:120]})") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UsageError(f"--config {path}: expected a mapping of option: value, got {type(doc).__name__}")
    return {_name(str(key), names, path): _value(str(key), value, path) for key, value in doc.items()}


def _name(key: str, names: Sequence[str], path: str) -> str:
    name = key.strip().lstrip("-").replace("-", "_")
    name = _ALIASES.get(name, name)
    if name in names:
        return name
    typed = [n.replace("_", "-") for n in names if n not in _ALIASES.values()] + ["gpu", "json"]
    close = difflib.get_close_matches(key.replace("_", "-"), typed, n=2, cutoff=0.7)
    raise UsageError(f"--config {path}: {key!r} is not an option of this command",
                     hint=("did you mean " + " or ".join(close)) if close else "keys are the long option names")


def _value(key: str, value: object, path: str) -> object:
    if isinstance(value, list):
        if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
            raise UsageError(f"--config {path}: {key!r} must be a list of words")
        return tuple(str(v) for v in value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (str, int, float)):
        return value
    raise UsageError(f"--config {path}: {key!r} must be a value or a list, not a {type(value).__name__}")
