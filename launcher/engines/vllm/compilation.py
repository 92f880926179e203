"""Which CUDA graphs vLLM captures, from the flags the operator pinned, read as vLLM reads them.

vLLM 0.32 takes the graph settings five ways, and the plan must count what they leave:
  * `--enforce-eager`: no graphs (config/vllm.py:1692-1693, :1929-1933);
  * `-O N` / `--optimization-level N` (0.12+): a default `cudagraph_mode` per level, NONE at O0,
    PIECEWISE at O1, FULL_AND_PIECEWISE at O2 and O3 (config/vllm.py:261, :282, :303, :324), applied
    only where the compilation config does not name one (`_apply_optimization_level_defaults`,
    config/vllm.py:1009-1037);
  * `--compilation-config JSON` / `-cc JSON` with `cudagraph_mode`, `cudagraph_capture_sizes`,
    `max_cudagraph_capture_size`; or the same keys dotted, `-cc.cudagraph_mode=NONE`, which
    FlexibleArgumentParser merges per flag spelling into one JSON appended after every other word,
    so it replaces an explicit JSON (utils/argparse_utils.py:337-470);
  * `--cudagraph-capture-sizes N [N ...]` and `--max-cudagraph-capture-size N` (0.12+), which vLLM
    copies into the compilation config and refuses beside the same key there (engine/arg_utils.py:2788-2803).
0.11 has no optimization levels: `-O` is `--compilation-config` itself (0.11.0 engine/arg_utils.py:934),
a bare digit is the compilation level, and a level other than 3 (PIECEWISE) with no `cudagraph_mode`
means no graphs (0.11.0 config/__init__.py:336-376).
0.34 adds five compilation-config keys that size the two kinds of graph apart (config/compilation.py:762-807):
the prefill (mixed-batch) token sizes or their ceiling, the decode request counts or their ceiling, and a
decode token budget; the two legacy keys are deprecated. Before 0.34 vLLM's parser refuses them (the config
forbids unknown fields, config/utils.py:70-71 in 0.33.0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.common.errors import UsageError
from launcher.engines.versions import version_key

# CUDAGraphMode's names (config/compilation.py, `CUDAGraphMode`); vLLM reads them case-blind.
MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
DEFAULT_MODE = "FULL_AND_PIECEWISE"  # from 0.11 (0.11.0 config/__init__.py:362-366); PIECEWISE before
LEVEL_MODES = {0: "NONE", 1: "PIECEWISE", 2: "FULL_AND_PIECEWISE", 3: "FULL_AND_PIECEWISE"}
OPTIMIZATION_LEVELS_SINCE = "0.12"  # 0.12.0 config/vllm.py:61 `OptimizationLevel`
MODES_SINCE = "0.11"  # the first release whose graph settings are read here
PIECEWISE_LEVEL = 3  # 0.11's CompilationLevel.PIECEWISE
LEVELS_AFTER_BARE_O = frozenset({"0", "1", "2", "3"})

_CONFIG_FLAGS = ("--compilation-config", "--compilation_config", "-cc")
# What the plan reads of the compilation config. Its `mode` tells only whether the forward is compiled
# (`compiles_model`); the graphs' count does not read it: with compilation off vLLM turns the default
# FULL_AND_PIECEWISE into FULL (config/vllm.py:1077-1094), fewer graphs than counted.
# 0.34's split keys (config/compilation.py:762-807), each with the least value its pydantic field takes
# (None: a list of counts).
SPLIT_KEYS: dict[str, int | None] = {
    "prefill_cudagraph_capture_token_sizes": None, "max_prefill_cudagraph_capture_tokens": 0,
    "decode_cudagraph_capture_request_sizes": None, "max_decode_cudagraph_capture_requests": 0,
    "max_decode_cudagraph_capture_tokens": 1}
SPLIT_SIZES_SINCE = "0.34"  # separate prefill-token and decode-request capture sizes (config/vllm.py:2558-2737)
_KEYS = ("cudagraph_mode", "cudagraph_capture_sizes", "max_cudagraph_capture_size", "level", "mode", *SPLIT_KEYS)


# The pinned values' keys: vLLM's own flag names, values JSON-friendly (shown as kept, in the calibration key).
LEVEL_FLAG, CONFIG_FLAG = "--optimization-level", "--compilation-config"
SIZES_FLAG, MAX_SIZE_FLAG = "--cudagraph-capture-sizes", "--max-cudagraph-capture-size"


@dataclass(frozen=True)
class GraphPins:
    """The graph settings as written, before any version's defaults apply (None: not pinned)."""

    optimization_level: str | None = None  # `-O` / `--optimization-level` as written
    config: str | None = None  # the compilation config's graph keys, as JSON text
    capture_sizes: tuple[int, ...] | None = None  # --cudagraph-capture-sizes
    max_capture_size: int | None = None  # --max-cudagraph-capture-size

    def as_pinned(self) -> dict[str, object]:
        """The pinned values, under vLLM's flag names (only what was written)."""
        values = {LEVEL_FLAG: self.optimization_level, CONFIG_FLAG: self.config, SIZES_FLAG: self.capture_sizes,
                  MAX_SIZE_FLAG: self.max_capture_size}
        return {flag: value for flag, value in values.items() if value is not None}

    @classmethod
    def from_pinned(cls, pinned: Mapping[str, Any]) -> GraphPins:
        return cls(pinned.get(LEVEL_FLAG), pinned.get(CONFIG_FLAG), pinned.get(SIZES_FLAG), pinned.get(MAX_SIZE_FLAG))

    def value(self, key: str) -> object:
        return json.loads(self.config).get(key) if self.config else None


@dataclass(frozen=True)
class SplitPins:
    """0.34's split capture settings as pinned (None: vLLM's default for that kind)."""

    prefill_sizes: tuple[int, ...] | None = None  # prefill_cudagraph_capture_token_sizes
    max_prefill_tokens: int | None = None  # max_prefill_cudagraph_capture_tokens
    decode_sizes: tuple[int, ...] | None = None  # decode_cudagraph_capture_request_sizes
    max_decode_requests: int | None = None  # max_decode_cudagraph_capture_requests
    max_decode_tokens: int | None = None  # max_decode_cudagraph_capture_tokens

    @property
    def sets_sizes(self) -> bool:
        """Whether a size or a ceiling of either kind is pinned (`uses_split_sizes`, config/vllm.py:2578-2586;
        the decode token budget is not one)."""
        return any(v is not None for v in (self.prefill_sizes, self.max_prefill_tokens, self.decode_sizes,
                                           self.max_decode_requests))

    @property
    def any_pinned(self) -> bool:
        return self.sets_sizes or self.max_decode_tokens is not None


@dataclass(frozen=True)
class GraphMode:
    """The `cudagraph_mode` vLLM runs with and the capture sizes the operator fixed, with why."""

    mode: str
    reason: str
    capture_sizes: tuple[int, ...] | None = None  # explicit sizes (before vLLM's max_num_batched_tokens cut)
    max_capture_size: int | None = None  # an explicit ceiling for vLLM's default list
    pinned: bool = False
    split: SplitPins = SplitPins()  # 0.34's per-kind sizes


def read_graph_pins(argv: Sequence[str]) -> GraphPins:
    """The graph settings in `argv`, as FlexibleArgumentParser and argparse would leave them."""
    reader = _Reader(tuple(argv))
    while reader.i < len(argv):
        reader.step()
    return reader.pins()


class _Reader:
    """One pass over the argv; each flag's value read as argparse reads it (`--flag v` or `--flag=v`)."""

    def __init__(self, argv: tuple[str, ...]) -> None:
        self.argv, self.i = argv, 0
        self.level: str | None = None
        self.explicit: dict[str, object] | None = None  # the last `--compilation-config JSON`
        self.dotted: dict[str, dict[str, object]] = {}  # per spelling, merged in order (argparse_utils.py:405-455)
        self.sizes: tuple[int, ...] | None = None
        self.max_size: int | None = None

    def pins(self) -> GraphPins:
        # The dotted keys are appended as one JSON per spelling after every other word: the last wins.
        config = next(reversed(self.dotted.values())) if self.dotted else self.explicit
        return GraphPins(self.level, _graph_keys(config), self.sizes, self.max_size)

    def step(self) -> None:
        word = self.argv[self.i]
        name, eq, inline = word.partition("=")
        if word.startswith("-O") and word != "-O":  # argparse_utils.py:358-362
            self.level = word[3:] if word[2:3] == "=" else word[2:]
            self.i += 1
        elif word == "-O" and self._following() in LEVELS_AFTER_BARE_O:  # :363-369
            self.level = self._following()
            self.i += 2
        elif "." in name and name.split(".", 1)[0] in _CONFIG_FLAGS:
            self._dotted(name, self._value(name, inline if eq else None))
        elif name in _READERS:
            _READERS[name](self, name, inline if eq else None)
        else:
            self.i += 1

    def _following(self) -> str | None:
        return self.argv[self.i + 1] if self.i + 1 < len(self.argv) else None

    def _value(self, name: str, inline: str | None) -> str:
        """The flag's one value (`--flag=v` or `--flag v`); moves past it."""
        text = inline if inline is not None else self._following()
        self.i += 1 if inline is not None else 2
        return _value(name, text)

    def _dotted(self, name: str, text: str) -> None:
        flag, key = name.split(".", 1)
        parsed: object
        if key.endswith("+"):  # `-cc.key+ a,b`: a list of strings (argparse_utils.py:434-436)
            key, parsed = key[:-1], text.split(",")
        else:
            parsed = dotted_value(text)
        self.dotted.setdefault(flag.replace("_", "-"), {})[key] = parsed

    def read_level(self, name: str, inline: str | None) -> None:
        self.level = self._value(name, inline)

    def read_config(self, name: str, inline: str | None) -> None:
        self.explicit = _json_config(name, self._value(name, inline))

    def read_sizes(self, name: str, inline: str | None) -> None:
        """`--cudagraph-capture-sizes 1 2 4` (nargs "+", type int) or `--cudagraph-capture-sizes=8`."""
        if inline is not None:
            self.sizes, self.i = (_int(name, inline),), self.i + 1
            return
        end = self.i + 1
        while end < len(self.argv) and self.argv[end].isdigit():
            end += 1
        if end == self.i + 1:
            raise UsageError(f"engine flag {name} needs at least one count")
        self.sizes, self.i = tuple(int(word) for word in self.argv[self.i + 1:end]), end

    def read_max_size(self, name: str, inline: str | None) -> None:
        self.max_size = _int(name, self._value(name, inline))


_READERS = {
    **dict.fromkeys(("--optimization-level", "--optimization_level"), _Reader.read_level),
    **dict.fromkeys(_CONFIG_FLAGS, _Reader.read_config),
    **dict.fromkeys(("--cudagraph-capture-sizes", "--cudagraph_capture_sizes", "--cuda-graph-sizes"),
                    _Reader.read_sizes),
    **dict.fromkeys(("--max-cudagraph-capture-size", "--max_cudagraph_capture_size"), _Reader.read_max_size),
}


def pinned_graph_flags(argv: Sequence[str]) -> dict[str, object]:
    """The graph settings of `argv` as pinned values (read once, with the other pinned flags)."""
    return read_graph_pins(argv).as_pinned()


def graph_mode(pins: GraphPins, *, enforce_eager: bool, version: str) -> GraphMode:
    """The mode vLLM `version` resolves from the pins (and the ceiling or sizes it captures)."""
    since = version_key(version)
    if enforce_eager:
        return GraphMode("NONE", "--enforce-eager", pinned=True)
    if since < version_key(MODES_SINCE):
        return GraphMode("PIECEWISE", f"vLLM {version}: PIECEWISE graphs (FULL_AND_PIECEWISE from 0.11)")
    sizes, ceiling = _capture_pins(pins, version)
    split = _split_pins(pins, version)
    named = pins.value("cudagraph_mode")
    if named is not None:
        mode = str(named).upper()
        if mode not in MODES:
            raise UsageError(f"engine flag compilation config: cudagraph_mode {named!r} is not one of vLLM's "
                             f"modes ({', '.join(MODES)})")
        return GraphMode(mode, f"pinned cudagraph_mode {mode}", sizes, ceiling, pinned=True, split=split)
    if since < version_key(OPTIMIZATION_LEVELS_SINCE):
        return _mode_from_level_0_11(pins, version, sizes, ceiling)
    if pins.optimization_level is not None and pins.optimization_level in {"0", "1", "2", "3"}:
        mode = LEVEL_MODES[int(pins.optimization_level)]
        return GraphMode(mode, f"pinned -O{pins.optimization_level}: cudagraph_mode {mode} (config/vllm.py:261-324)",
                         sizes, ceiling, pinned=True, split=split)
    fixed = sizes is not None or ceiling is not None or split.any_pinned
    reason = f"{DEFAULT_MODE} (vLLM's default -O2)" + (" at the pinned capture sizes" if fixed else "")
    return GraphMode(DEFAULT_MODE, reason, sizes, ceiling, pinned=fixed, split=split)


def _split_pins(pins: GraphPins, version: str) -> SplitPins:
    """0.34's split keys as pinned, refused as vLLM's parser refuses them: unknown before 0.34, a count
    below its field's least value, a size list that is not counts (config/compilation.py:762-807)."""
    written = {key: pins.value(key) for key in SPLIT_KEYS if pins.value(key) is not None}
    if written and version_key(version) < version_key(SPLIT_SIZES_SINCE):
        raise UsageError(f"vLLM {version}'s parser refuses compilation_config.{next(iter(written))}: the key "
                         f"is new in {SPLIT_SIZES_SINCE} (its config forbids unknown fields)")
    values: dict[str, object] = {}
    for key, value in written.items():
        least = SPLIT_KEYS[key]
        if least is None:
            values[key] = _ints(value, key)
        elif (count := pydantic_int(value)) is None or count < least:
            raise UsageError(f"engine flag compilation config: {key} {value!r} is not a count of at least {least} "
                             "(vLLM's parser refuses it)")
        else:
            values[key] = count
    return SplitPins(*(values.get(key) for key in SPLIT_KEYS))  # type: ignore[arg-type]


def _mode_from_level_0_11(pins: GraphPins, version: str, sizes: tuple[int, ...] | None,
                          ceiling: int | None) -> GraphMode:
    """0.11: `-O N` is the compilation level; below PIECEWISE (3) no graphs unless a mode is named."""
    level = pins.value("level")
    if level is None and pins.optimization_level is not None and pins.optimization_level.isdigit():
        level = int(pins.optimization_level)
    if level is not None and level != PIECEWISE_LEVEL:
        return GraphMode("NONE", f"pinned compilation level {level} on vLLM {version}: no graphs "
                         "(0.11.0 config/__init__.py:359-376)", pinned=True)
    return GraphMode(DEFAULT_MODE, f"vLLM {version}'s default", sizes, ceiling)


def _capture_pins(pins: GraphPins, version: str) -> tuple[tuple[int, ...] | None, int | None]:
    """The explicit sizes and ceiling, refusing what vLLM refuses (engine/arg_utils.py:2789-2800)."""
    in_config_sizes, in_config_max = pins.value("cudagraph_capture_sizes"), pins.value("max_cudagraph_capture_size")
    if pins.capture_sizes is not None and in_config_sizes is not None:
        raise UsageError("vLLM refuses --cudagraph-capture-sizes beside compilation_config.cudagraph_capture_sizes: "
                         "they are mutually exclusive (engine/arg_utils.py:2789-2793)")
    if pins.max_capture_size is not None and in_config_max is not None:
        raise UsageError("vLLM refuses --max-cudagraph-capture-size beside "
                         "compilation_config.max_cudagraph_capture_size: they are mutually exclusive "
                         "(engine/arg_utils.py:2796-2800)")
    sizes = (pins.capture_sizes if pins.capture_sizes is not None
             else _ints(in_config_sizes, "cudagraph_capture_sizes"))
    ceiling = pins.max_capture_size if pins.max_capture_size is not None else in_config_max
    if ceiling is not None and not isinstance(ceiling, int):
        raise UsageError(f"engine flag compilation config: max_cudagraph_capture_size {ceiling!r} is not a count")
    if sizes is not None and not sizes:
        raise UsageError("vLLM refuses an empty cudagraph_capture_sizes with CUDA graphs on (config/vllm.py:2455-2458)")
    if version_key(version) < version_key(OPTIMIZATION_LEVELS_SINCE) and (sizes is not None or ceiling is not None):
        return None, None  # not read for 0.11 here: vLLM's defaults are counted (more graphs: the safe side)
    return sizes, ceiling


def pydantic_int(value: object) -> int | None:
    """A count as pydantic's lax `int` takes it in vLLM's config classes: an int, a bool, a string of digits,
    a whole float; None where it refuses."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) < 40:
        return int(value.strip())
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return None


def _ints(value: object, key: str) -> tuple[int, ...] | None:
    """A list of counts as vLLM's `list[int]` field reads it, sorted and without repeats."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) or (isinstance(v, str) and v.isdigit())
                                              for v in value):
        raise UsageError(f"engine flag compilation config: {key} {value!r} is not a list of counts")
    return tuple(sorted({int(v) for v in value}))


# vLLM's compilation modes by value (config/compilation.py:38-51); 0.11's levels number the same way.
COMPILATION_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")


def compiles_model(pins: GraphPins, *, enforce_eager: bool) -> bool:
    """Whether vLLM runs its own piecewise compile (VLLM_COMPILE: Dynamo, its split at the attention ops,
    Inductor): not under --enforce-eager or -O0 (config/vllm.py:1697-1699, :1758-1762), and a pinned mode
    (0.11: level), if any, VLLM_COMPILE; stock torch.compile and a single Dynamo trace compile otherwise. A
    mode vLLM's parser refuses (config/compilation.py:1003-1025) is refused here too."""
    if enforce_eager or (pins.optimization_level or "").strip() == "0":
        return False
    for key in ("mode", "level"):
        value = pins.value(key)
        if value is None:
            continue
        name = _mode_name(value, key)
        if name is None:
            raise UsageError(f"engine flag compilation config: {key} {value!r} is not one of vLLM's compilation "
                             f"modes (0-3 or {', '.join(COMPILATION_MODES)})")
        if name != "VLLM_COMPILE":
            return False
    return True


def _mode_name(value: object, key: str) -> str | None:
    """A mode as vLLM's validator takes it: a name (any case; `mode` only) or its number (lax int)."""
    if isinstance(value, str) and key == "mode" and value.upper() in COMPILATION_MODES:
        return value.upper()
    number = None if isinstance(value, str) and key == "mode" else pydantic_int(value)
    return COMPILATION_MODES[number] if number is not None and 0 <= number < len(COMPILATION_MODES) else None


def _graph_keys(config: dict[str, object] | None) -> str | None:
    """The graph keys of a compilation config as compact JSON (None: none of them)."""
    kept = {key: config[key] for key in _KEYS if key in config} if config else {}
    return json.dumps(kept, separators=(",", ":")) if kept else None


def _value(name: str, text: str | None) -> str:
    if text is None:
        raise UsageError(f"engine flag {name} needs a value")
    return text


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"engine flag {name}: cannot read {text!r} as a count") from None


def _json_config(name: str, text: str | None) -> dict[str, object]:
    """`--compilation-config JSON`, or a bare digit: the level (0.11's `-O3`, CompilationConfig.from_cli)."""
    raw = _value(name, text)
    if raw.strip().isdigit():
        return {"level": int(raw)}
    try:
        parsed = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: nesting deeper than Python's stack
        raise UsageError(f"engine flag {name}: cannot read {raw[:80]!r} as JSON") from None
    if not isinstance(parsed, dict):
        raise UsageError(f"engine flag {name}: the compilation config must be a JSON object")
    return parsed


def dotted_value(text: str) -> object:
    """A dotted key's value: JSON, else a human-readable count, else the text (argparse_utils.py:438-446)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(f"engine flag value {text[:80]!r}: nested deeper than can be read") from None
    except json.JSONDecodeError:
        from launcher.engines.flags import human_int

        try:
            return human_int(text)
        except ValueError:
            return text
