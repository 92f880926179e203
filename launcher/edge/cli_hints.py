"""The CLI's helpful edge, as pure functions: hints for common mistakes, help text, completion.

`cli.py` calls these; nothing here parses the command line or exits.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Iterable, Sequence

import click

PROG = "safe-serve"
COMPLETE_VAR = "_SAFE_SERVE_COMPLETE"  # click: "_" + prog name upper-cased, "-" -> "_", + "_COMPLETE"

EPILOG = """\b
`safe-serve MODEL ...` is `safe-serve serve MODEL ...`: plan, start, watch.
Engine flags go after `--`, exactly as the engine takes them.

\b
Examples:
  safe-serve plan qwen2.5-7b --gpu rtx4090            # plan for a catalog GPU, no GPU needed
  safe-serve plan qwen2.5-7b -- --max-model-len 8192  # a pinned engine flag
  safe-serve qwen2.5-7b --dry-run                     # the plan and the exact command line
  safe-serve qwen2.5-7b --concurrency 4 -- --port 8000  # plan, start, watch
  safe-serve fit qwen2.5-7b --concurrency 32 --tokens 4096   # which GPU carries this?
  safe-serve gpus                                     # what is free, and who holds the rest

\b
Shell completion (bash; zsh_source and fish_source work alike):
  eval "$(_SAFE_SERVE_COMPLETE=bash_source safe-serve)"
"""


def completion_instructions(shell: str) -> str:
    """The line to put in the shell's rc file (click's built-in completion)."""
    if shell == "fish":
        return f"{COMPLETE_VAR}=fish_source {PROG} | source  # in ~/.config/fish/completions/{PROG}.fish"
    if shell in ("bash", "zsh"):
        return f'eval "$({COMPLETE_VAR}={shell}_source {PROG})"  # in ~/.{shell}rc'
    raise ValueError(f"click completes bash, zsh and fish, not {shell!r}")


def _split_option(token: str) -> str:
    return token.split("=", 1)[0]


def engine_flags_moved(argv: Sequence[str], option: str) -> list[str]:
    """`argv` with `option` (and its value, if the next word is not a flag) moved after `--`.

    The value rule is a guess for the hint only: boolean engine flags take no value.
    """
    args = list(argv)
    tail: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, tail = args[:cut], args[cut + 1:]
    moved: list[str] = []
    kept: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if _split_option(token) == option:
            moved.append(token)
            if "=" not in token and i + 1 < len(args) and not args[i + 1].startswith("-"):
                moved.append(args[i + 1])
                i += 1
        else:
            kept.append(token)
        i += 1
    return [*kept, "--", *moved, *tail]


def no_such_option_hint(option: str, possibilities: Iterable[str] | None, argv: Sequence[str],
                        engine_flags: Collection[str]) -> str | None:
    """For click's "No such option '--max-model-len'": say that engine flags go after `--`.

    A near miss of one of our own options ("--concurency") keeps click's "Did you mean";
    a known engine flag, or an unknown flag with no near miss, gets the `--` hint with the
    corrected command line.
    """
    close = list(possibilities or ())
    option = _as_typed(option, argv, engine_flags)
    if option not in engine_flags and close:
        return None
    fixed = engine_flags_moved(argv, option)
    return f"engine flags go after `--`: {PROG} {shlex.join(fixed)}"


def _as_typed(option: str, argv: Sequence[str], engine_flags: Collection[str]) -> str:
    """click reports `-tp` as the short option `-t` it starts with: the word as typed, when it is an engine flag."""
    if option.startswith("--"):
        return option
    words = list(argv)[: list(argv).index("--")] if "--" in argv else list(argv)
    typed = next((_split_option(w) for w in words if w.startswith(option) and _split_option(w) in engine_flags), None)
    return typed or option


def usage_hint(exc: click.UsageError, argv: Sequence[str],
               engine_flags: Collection[str]) -> str | None:
    """A one-line hint for a click usage error, or None when click's own message says enough."""
    if isinstance(exc, click.NoSuchOption):
        possibilities = exc.possibilities if exc.possibilities is not None else ()
        # click keeps only the close matches of its own options in `possibilities`.
        return no_such_option_hint(exc.option_name, possibilities, argv, engine_flags)
    return None
