"""Engine lines are read as the engine's own records, in time linear in the line.

* every rule of both engines fires on its genuine record (the engine's own format);
* the same words quoted by strangers (request logs in the engine's real format, the web server's
  access log, a request's own traceback, raw output with no traceback open) never fire a rule,
  so a prompt can neither stop a healthy server nor change the next plan's calibration;
* every rule, fed adversarial lines of 1 MB in several shapes, answers within a generous bound
  (catches quadratic behaviour; bench/log_rules.py prints the figures).
"""

from __future__ import annotations

import time

import pytest

from launcher.engines import adapter
from launcher.engines.events import LogReader
from tests.hostile_lines import SAMPLES, Sample, adversarial, quoted

PER_LINE_BOUND_S = 0.5  # a 1 MB line costs ~1 ms; backtracking patterns took 10 s for 440 KB


def read_all(engine: str, lines: tuple[str, ...], reader: LogReader | None = None) -> list[str]:
    reader = reader or adapter(engine).log_reader({})
    kinds = []
    for line in lines:
        event = reader.read("stdout", line)
        if event is not None:
            kinds.append(event.kind)
    return kinds


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: f"{s.engine}-{s.kind}")
def test_each_rule_reads_its_engine_record(sample: Sample) -> None:
    """The genuine record (after its traceback, where it has one) gives the rule's event."""
    assert read_all(sample.engine, sample.lines)[-1] == sample.kind


SEVERE = [s for s in SAMPLES if s.kind.startswith(("fatal:", "crash:"))]
FIGURES = [s for s in SAMPLES if s.kind in ("kv", "available_kv", "weights", "kv_alloc", "pre_load")]


@pytest.mark.parametrize("sample", SEVERE + FIGURES, ids=lambda s: f"{s.engine}-{s.kind}")
def test_quoted_words_fire_nothing(sample: Sample) -> None:
    """A stranger's text holding the rule's words, wherever the engine prints it: no event."""
    for lines in quoted(sample.engine, sample.message):
        assert read_all(sample.engine, lines) == [], lines


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_request_log_closes_an_open_traceback(engine: str) -> None:
    """A record between a traceback and a quoted exception line ends the traceback."""
    head = "(APIServer pid=8) INFO 12-01 10:00:00 [request_logger.py:65] " if engine == "vllm" else \
        "[2026-12-01 10:00:00] "
    lines = ("Traceback (most recent call last):", f"{head}Received request x: params: SamplingParams(n=1)",
             "torch.OutOfMemoryError: CUDA out of memory.")
    assert read_all(engine, lines) == []


def test_vllm_colour_and_prefix() -> None:
    """Forced colour (ColoredFormatter) and VLLM_LOGGING_PREFIX are part of the header."""
    coloured = ("\x1b[0;36m(EngineCore pid=7)\x1b[0;0m \x1b[31mERROR\x1b[0m \x1b[90m12-01 10:00:00\x1b[0m "
                "\x1b[90m[core.py:1586]\x1b[0m EngineCore encountered a fatal error.")
    assert read_all("vllm", (coloured,)) == ["crash:engine_core"]
    reader = adapter("vllm").log_reader({"VLLM_LOGGING_PREFIX": "[node-3] "})
    line = "[node-3] (EngineCore pid=7) ERROR 12-01 10:00:00 [core.py:1586] EngineCore encountered a fatal error."
    assert read_all("vllm", (line,), reader) == ["crash:engine_core"]


def test_vllm_info_record_never_fatal() -> None:
    """The fatal words at INFO (a multi-line record's next line repeats the INFO header) are not a report."""
    line = "(EngineCore pid=7) INFO 12-01 10:00:00 [core.py:1] EngineCore encountered a fatal error."
    assert read_all("vllm", (line,)) == []


def _worst(sample: Sample) -> tuple[float, str]:
    reader = adapter(sample.engine).log_reader({})
    for before in sample.lines[:-1]:
        reader.read("stdout", before)
    worst = (0.0, "")
    for shape, line in adversarial(sample):
        started = time.perf_counter()
        reader.read("stdout", line)
        worst = max(worst, (time.perf_counter() - started, shape))
        for before in sample.lines[:-1]:  # keep the traceback open for the next shape
            reader.read("stdout", before)
    return worst


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: f"{s.engine}-{s.kind}")
def test_one_megabyte_lines_are_linear(sample: Sample) -> None:
    """Every rule, every adversarial shape of 1 MB: well under the bound (bench/log_rules.py: figures)."""
    seconds, shape = _worst(sample)
    assert seconds < PER_LINE_BOUND_S, f"{shape}: {seconds:.3f} s"
