"""What safe-serve shows of text others control: one line, escaped, of a readable length."""

from __future__ import annotations

from launcher.common.shown import clipped, printable


def test_long_runs_are_cut_and_counted() -> None:
    line = f"invalid choice: '{'x' * 100_000}' (choose from auto, triton)"
    shown = clipped(line)
    assert shown == f"invalid choice: '{'x' * 79}...(100,002 characters) (choose from auto, triton)"


def test_words_and_paths_of_ordinary_length_are_kept() -> None:
    path = "/models/" + "a" * 180  # quoted, with its colon: 191 characters, kept whole
    line = f"model {path!r}: not a directory, and hf_xyz not a file"
    assert clipped(line) == line


def test_runs_at_the_limit() -> None:
    """200 characters are kept, 201 cut: each run on its own."""
    line = " ".join(["y" * 200, "z" * 201] * 2_000)
    shown = clipped(line)
    assert shown.count("...(201 characters)") == 2_000 and shown.count("y" * 200) == 2_000


def test_escapes_survive_the_cut() -> None:
    assert printable(clipped("a\nb " + "\x1b" * 300)) == "a\\nb " + "\\x1b" * 80 + "...(300 characters)"
