"""What safe-serve shows of text others control: secrets masked, control characters escaped.

Secrets never reach a log line, a plan table, JSON or a dry-run command.

The engine itself gets the real values; everything safe-serve *shows* passes through these
maskers. Which engine flags carry secrets is each engine's knowledge (`SECRET_FLAGS` in its
package, read through the adapter's `shown_argv`); environment entries are masked by name here:
``*_TOKEN``, ``*_KEY``, ``*_SECRET``, ``*PASSWORD``/``*PASSWD`` (``HF_TOKEN``, ``OPENAI_API_KEY``,
``AWS_SECRET_ACCESS_KEY``), as ``NAME=value`` words in a command (``--engine-cmd "env
HF_TOKEN=..."``) or as entries of an environment mapping.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"
_SECRET_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:_TOKEN|_KEY|_SECRET|PASSWORD|PASSWD)", re.IGNORECASE)
_SECRET_ENV_BARE = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY"})


def is_secret_env_name(name: str) -> bool:
    """True for environment names whose value is a credential by convention."""
    return bool(_SECRET_ENV_NAME.fullmatch(name)) or name.upper() in _SECRET_ENV_BARE


def shown_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` as it may be shown: secret-named values replaced by `REDACTED`."""
    return {k: REDACTED if is_secret_env_name(k) else v for k, v in env.items()}


def shown_assignments(argv: Sequence[str]) -> list[str]:
    """`argv` with the values of ``NAME=value`` words of secret names replaced (``env HF_TOKEN=...``)."""
    out = []
    for word in argv:
        name, eq, _ = word.partition("=")
        out.append(f"{name}={REDACTED}" if eq and not word.startswith("-") and is_secret_env_name(name) else word)
    return out


_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


# A run of text without spaces this long is a pasted value, not a word: `--moe-backend` of 100,000
# characters is echoed by the engine's own refusal ("invalid choice: 'xxx...'").
_LONG_RUN = re.compile(r"\S{201,}")


def clipped(line: str, keep: int = 80) -> str:
    """`line` with every run of over 200 non-space characters cut to its first `keep`, and its length
    said: an error line stays one readable line whatever value it quotes (linear in the line)."""
    return _LONG_RUN.sub(lambda run: f"{run.group()[:keep]}...({len(run.group()):,} characters)", line)


def printable(line: str) -> str:
    """`line` with every control, format and line-separator character escaped (``\\n``,
    ``\\x1b``, ``\\u2028``): a model name or path holding a newline or a terminal escape
    cannot forge a line of plain-text output or repaint the terminal."""
    if line.isprintable():
        return line
    return "".join(ch if ch.isprintable() or ch == " " or unicodedata.category(ch) not in _ESCAPED_CATEGORIES
                   else ascii(ch)[1:-1] for ch in line)
