"""Engine flags checked against the engine's own argparse (launcher/engines/<engine>/argparse_flags.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.common.errors import UsageError
from launcher.engines import ENGINES, adapter
from launcher.engines.accepted_flags import check_engine_args
from launcher.engines.sglang.accepted import ACCEPTED as SGLANG
from launcher.engines.vllm.accepted import ACCEPTED as VLLM

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str]) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "launcher", *argv], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(("engine", "flags", "names"), [
    ("sglang", ["--max-model-len", "4096"], ("--max-model-len", "--context-length")),
    ("sglang", ["-tp", "2"], ("-tp", "--tp-size")),
    ("sglang", ["--gpu-memory-utilization", "0.8"], ("--gpu-memory-utilization", "--mem-fraction-static")),
    ("vllm", ["--mem-fraction-static", "0.8"], ("--mem-fraction-static", "--gpu-memory-utilization")),
    ("vllm", ["--context-length", "4096"], ("--context-length", "--max-model-len")),
    ("vllm", ["--tp-size", "2"], ("--tp-size", "--tensor-parallel-size")),
])
def test_the_other_engines_spelling_is_exit_2_naming_ours(engine: str, flags: list[str],
                                                          names: tuple[str, str]) -> None:
    code, out, err = run(["qwen2.5-7b", "--engine", engine, "--gpu", "rtx4090", "--dry-run", "--", *flags])
    assert code == 2 and out == ""
    line = err.strip()
    assert len(line.splitlines()) == 1 and names[0] in line and f"spelling is {names[1]}" in line


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "--model"), ("sglang", "--model-path"), ("sglang", "--model")])
def test_a_second_model_is_exit_2(engine: str, flag: str) -> None:
    code, _, err = run(["plan", "qwen2.5-7b", "--engine", engine, "--gpu", "rtx4090", "--", flag, "other/model"])
    assert code == 2 and "second model" in err and flag in err


def test_a_typo_in_the_newest_release_gets_the_close_spelling() -> None:
    with pytest.raises(UsageError) as caught:
        check_engine_args(VLLM, "0.32.0", ["--max-modl-len", "4096"])
    assert "0.32.0" in caught.value.message and "--max-model-len" in str(caught.value.hint)


def test_argparse_spellings_the_engines_take() -> None:
    """vLLM converts _ to - (FlexibleArgumentParser); both take a unique prefix (allow_abbrev); -1 is a value."""
    assert check_engine_args(VLLM, "0.32.0", ["--max_model_len", "-1", "--max-num-seq", "4", "-tp=2"]) == ()
    assert check_engine_args(SGLANG, "0.5.23", ["--context-len", "4096", "--tp-size", "2"]) == ()
    with pytest.raises(UsageError, match="--tp_size"):
        check_engine_args(SGLANG, "0.5.23", ["--tp_size", "2"])  # plain argparse: no underscore spelling


@pytest.mark.parametrize("flags", [["-O3"], ["-O", "3"], ["-O=3"], ["-O0", "--enforce-eager"], ["-Odecode"]])
def test_vllm_optimization_short_flag_is_taken(flags: list[str]) -> None:
    """vLLM rewrites -O3 / -O 3 / -O=3 to --optimization-level (argparse_utils.py:358-369): not exit 2 (was)."""
    for version in ("0.31.0", "0.32.0", "0.33.0", "0.34.0"):
        assert check_engine_args(VLLM, version, flags) == ()


def test_vllm_bare_short_o_without_a_level_is_still_refused() -> None:
    """`-O decode` is not rewritten by vLLM (only 0-3 follow a bare -O): its argparse refuses `-O`."""
    with pytest.raises(UsageError, match="-O"):
        check_engine_args(VLLM, "0.32.0", ["-O", "decode"])


@pytest.mark.parametrize(("engine", "argv"), [
    ("vllm", ["qwen2.5-7b", "stray", "--dry-run", "--gpu", "h100"]),  # before `--`: click collects it too
    ("vllm", ["qwen2.5-7b", "--dry-run", "--gpu", "h100", "--", "8000", "--port", "8001"]),
    ("sglang", ["qwen2.5-7b", "--engine", "sglang", "--dry-run", "--gpu", "h100", "--", "Qwen/Other"]),
])
def test_a_leading_word_that_is_not_a_flag_is_exit_2(engine: str, argv: list[str]) -> None:
    """`vllm serve MODEL stray` / `launch_server stray` fail in the engine's argparse ("unrecognized
    arguments"); it was passed through to the engine command (`vllm serve Qwen/... stray ...`)."""
    code, out, err = run(argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "is neither a flag nor a flag's value" in err and ("vLLM" if engine == "vllm" else "SGLang") in err


def test_a_newer_release_than_our_table_warns_not_blocks() -> None:
    warnings = check_engine_args(VLLM, "0.40.0", ["--some-new-flag", "3"])
    assert len(warnings) == 1 and "--some-new-flag" in warnings[0] and "0.34.0" in warnings[0]
    with pytest.raises(UsageError, match="--context-length"):  # another engine's spelling: in every release
        check_engine_args(VLLM, "0.40.0", ["--context-length", "4096"])
    code, out, _ = run(["plan", "qwen2.5-7b", "--gpu", "rtx4090", "--engine-version", "0.40.0", "--json",
                        "--", "--some-new-flag", "3"])
    assert code == 0 and any("--some-new-flag" in note for note in json.loads(out)["notes"])


def test_a_flag_of_another_release_warns() -> None:
    only_new = sorted(VLLM.versions["0.32.0"] - VLLM.versions["0.31.0"])
    assert only_new, "0.32 adds flags over 0.31"
    warnings = check_engine_args(VLLM, "0.31.5", [only_new[0], "1"])  # between tables: not exact
    assert warnings and "another release" in warnings[0]


@pytest.mark.parametrize(("table", "version", "flags", "said"), [
    (SGLANG, "0.5.23", ["--attention-backend", "foo"], "argument --attention-backend: invalid choice: 'foo'"),
    (SGLANG, "0.5.23", ["--moe-runner-backend=Triton"], "invalid choice: 'Triton'"),  # SGLang: as typed
    (VLLM, "0.32.0", ["--moe-backend", "nope"], "argument --moe-backend: invalid choice: 'nope'"),
    (VLLM, "0.32.0", ["--kv_cache_dtype", "fp9"], "argument --kv_cache_dtype: invalid choice: 'fp9'"),
    (VLLM, "0.32.0", ["--moe-backe", "fp9"], "invalid choice: 'fp9'"),  # allow_abbrev: a unique prefix
])
def test_a_value_outside_argparse_choices_is_exit_2(table: object, version: str, flags: list[str],
                                                     said: str) -> None:
    """The engine's argparse refuses it before loading anything (engine_flags.py records `choices`)."""
    with pytest.raises(UsageError, match="refuses the command line") as caught:
        check_engine_args(table, version, flags)  # type: ignore[arg-type]
    assert said in caught.value.message


@pytest.mark.parametrize(("table", "version", "flags"), [
    (SGLANG, "0.5.23", ["--attention-backend", "fa3", "--moe-runner-backend", "triton_kernel"]),
    (VLLM, "0.32.0", ["--moe-backend", "Flashinfer-TRTLLM"]),  # vLLM lower-cases, '-' to '_' (arg_utils.py:1806)
    (VLLM, "0.32.0", ["--kv-cache-dtype", "fp8", "--dtype=half"]),
])
def test_values_argparse_takes_pass(table: object, version: str, flags: list[str]) -> None:
    assert check_engine_args(table, version, flags) == ()  # type: ignore[arg-type]


def test_a_choice_of_an_unread_release_warns() -> None:
    """0.32.5 sits between the tables: the newest read below it (0.32.0) vouches for nothing exactly."""
    assert "aiter_triton_mxfp4_mxfp4" in VLLM.choices["0.33.0"]["--moe-backend"].values  # new in 0.33
    with pytest.raises(UsageError, match="invalid choice"):
        check_engine_args(VLLM, "0.32.0", ["--moe-backend", "aiter_triton_mxfp4_mxfp4"])
    warnings = check_engine_args(VLLM, "0.32.5", ["--moe-backend", "brand_new"])
    assert len(warnings) == 1 and "invalid choice: 'brand_new'" in warnings[0] and "the engine decides" in warnings[0]


def test_the_refusal_is_one_line_through_the_cli() -> None:
    code, out, err = run(["plan", "qwen2.5-7b", "--engine", "sglang", "--gpu", "h100", "--", "--attention-backend",
                          "x" * 100_000])
    assert code == 2 and out == "" and len(err.strip().splitlines()) <= 2 and len(err) < 2_000, err[:300]
    assert "SGLang 0.5.23 refuses the command line: argument --attention-backend: invalid choice" in err


@pytest.mark.parametrize("engine", ENGINES)
def test_every_flag_we_read_or_set_is_in_every_release_we_read(engine: str) -> None:
    """Our own flag tables and the flags the plan sets are real flags of every release read."""
    from importlib import import_module

    rules = import_module(f"launcher.engines.{engine}")
    table = VLLM if engine == "vllm" else SGLANG
    ours = {n for spec in rules.FLAGS for n in (spec.name, *spec.aliases)} | set(rules.OTHER_FLAGS)
    ours |= {adapter(engine).length_flag, adapter(engine).tp_flag, adapter(engine).pp_flag}
    from launcher.engines.accepted_flags import known_flag
    from launcher.engines.versions import version_key

    newest = max(table.versions, key=version_key)
    everywhere = frozenset().union(*table.versions.values())
    assert {f for f in ours if not known_flag(f, everywhere, table.underscores)} == set()  # each is real somewhere
    assert all(known_flag(f, table.versions[newest], table.underscores) for f in
               (adapter(engine).length_flag, adapter(engine).tp_flag, adapter(engine).pp_flag))  # what we set
    for foreign, spelling in table.equivalents.items():
        assert foreign not in frozenset().union(*table.versions.values()), foreign
        assert spelling.split()[0] in table.versions[newest], spelling


def _live(python_env: str, engine: str, tmp_path: Path) -> dict[str, list[str]]:
    python = os.environ.get(python_env)
    if not python:
        pytest.skip(f"{python_env} not set")
    out = tmp_path / "flags.json"
    proc = subprocess.run([python, str(ROOT / "tests/oracles/engine_flags.py"), engine, str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    return {"version": doc["version"], "choices": doc["choices"], **doc["flags"]}


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "python_env"), [("vllm", "SAFE_SERVE_VLLM_PYTHON"),
                                                    ("sglang", "SAFE_SERVE_SGLANG_PYTHON")])
def test_the_table_is_the_installed_engines_argparse(engine: str, python_env: str, tmp_path: Path) -> None:
    live = _live(python_env, engine, tmp_path)
    version = live.pop("version")
    table = json.loads((ROOT / f"launcher/engines/{engine}/argparse_flags.json").read_text())["versions"]
    if version not in table:
        pytest.skip(f"{engine} {version} installed; the table has {sorted(table)}")
    choices = live.pop("choices")
    assert live == table[version]["flags"]
    assert choices == table[version]["choices"]


def test_vllm_033_keeps_the_hidden_negations() -> None:
    """0.33's EnableDisableAction pairs --enable-x with --disable-x and keeps --no-enable-x registered
    but hidden from help (utils/argparse_utils.py:120-151): both spellings are taken."""
    for flags in (["--no-enable-prefix-caching"], ["--disable-prefix-caching"], ["--enable-prefix-caching"]):
        assert check_engine_args(VLLM, "0.33.0", flags) == ()
        assert check_engine_args(VLLM, "0.34.0", flags) == ()
    with pytest.raises(UsageError, match="does not take engine flag --disable-prefix-caching"):
        check_engine_args(VLLM, "0.32.0", ["--disable-prefix-caching"])


def test_each_release_read_is_its_own_argparse() -> None:
    """Tables for vLLM 0.19-0.34 and SGLang 0.5.2-0.5.23 (engine_flags.py on each release's tree): a
    flag or value is taken exactly by the releases that had it."""
    assert check_engine_args(VLLM, "0.19.0", ["--calculate-kv-scales"]) == ()  # removed before 0.31
    with pytest.raises(UsageError, match="vLLM 0.31.0 does not take engine flag --calculate-kv-scales"):
        check_engine_args(VLLM, "0.31.0", ["--calculate-kv-scales"])
    assert check_engine_args(SGLANG, "0.5.9", ["--attention-backend", "fa4"]) == ()
    with pytest.raises(UsageError, match="SGLang 0.5.2 refuses the command line: argument --attention-backend: "
                                         "invalid choice: 'fa4'"):
        check_engine_args(SGLANG, "0.5.2", ["--attention-backend", "fa4"])
    warnings = check_engine_args(SGLANG, "0.5.5", ["--attention-backend", "fa4"])  # between 0.5.2 and 0.5.9
    assert len(warnings) == 1 and "SGLang 0.5.2's argparse" in warnings[0]


# vLLM 0.34.0's additions (engine_flags.py on the 0.34.0 tree: vllm/entrypoints/common/cli_args.py:432 and
# vllm/engine/arg_utils.py:966; the EngineArgs fields at :615, :624, :719-721, :812, :844).
VLLM_034_NEW = (
    ["--enable-extensible-kv-cache"], ["--no-enable-extensible-kv-cache"], ["--disable-extensible-kv-cache"],
    ["--checkpoint-prepare-on-startup"], ["--no-checkpoint-prepare-on-startup"],
    ["--shuffle-safetensors-files"], ["--no-shuffle-safetensors-files"],
    ["--max-num-inflight-kv-loads", "4"], ["--cache-aware-admission-window", "64"],
    ["--cache-aware-admission-threshold", "0.5"], ["--headless-client-handshake-address", "tcp://h:5"],
)


@pytest.mark.parametrize("flags", VLLM_034_NEW, ids=lambda f: f[0])
def test_vllm_034_new_flags_are_its_own(flags: list[str]) -> None:
    """Taken by 0.34.0 exactly; 0.33.0's argparse refuses them (exit 2 naming the release); between the two
    (0.33.5) the table below vouches for nothing exactly: a warning."""
    assert check_engine_args(VLLM, "0.34.0", flags) == ()
    assert check_engine_args(VLLM, None, flags) == ()  # no version asked: the newest table
    with pytest.raises(UsageError, match=f"vLLM 0.33.0 does not take engine flag {flags[0]}"):
        check_engine_args(VLLM, "0.33.0", flags)
    warnings = check_engine_args(VLLM, "0.33.5", flags)
    assert len(warnings) == 1 and flags[0] in warnings[0]


def test_vllm_034_keeps_every_033_flag() -> None:
    """0.34.0 removes no option string of 0.33.0 and adds 11 (7 arguments with their negations)."""
    assert VLLM.versions["0.33.0"] <= VLLM.versions["0.34.0"]
    assert len(VLLM.versions["0.34.0"] - VLLM.versions["0.33.0"]) == 11


@pytest.mark.parametrize(("flag", "value", "new_in_034"), [
    ("--gdn-prefill-backend", "hip", True),  # engine/arg_utils.py:1981 (GDN prefill on ROCm)
    ("--all2all-backend", "mori", True),  # MoRI EP, EPv2 where supported (config/parallel.py:54, :240-242)
    ("--gdn-prefill-backend", "sycl", False),  # 0.33's
    ("--moe-backend", "aiter_triton_mxfp4_mxfp4", False),  # kernel.py:122 MoEBackend: the same list as 0.33's
])
def test_vllm_034_choices(flag: str, value: str, new_in_034: bool) -> None:
    assert check_engine_args(VLLM, "0.34.0", [flag, value]) == ()
    if new_in_034:
        with pytest.raises(UsageError, match=f"vLLM 0.33.0 refuses the command line: argument {flag}: "
                                             f"invalid choice: '{value}'"):
            check_engine_args(VLLM, "0.33.0", [flag, value])
    else:
        assert check_engine_args(VLLM, "0.33.0", [flag, value]) == ()
    with pytest.raises(UsageError, match="invalid choice: 'rocm'"):
        check_engine_args(VLLM, "0.34.0", [flag, "rocm"])


def test_vllm_034_kv_cache_dtype_has_no_argparse_choices() -> None:
    """From 0.33 the flag takes any string (CacheConfig validates it: launcher/engines/vllm/checks.py)."""
    assert "--kv-cache-dtype" not in VLLM.choices["0.34.0"] and "--kv-cache-dtype" in VLLM.choices["0.32.0"]
    assert check_engine_args(VLLM, "0.34.0", ["--kv-cache-dtype", "octave_k3v4"]) == ()


@pytest.mark.parametrize(("engine", "argv", "flag", "value"), [
    ("vllm", ["--max-model", "8192"], "--max-model-len", 8192),
    ("vllm", ["--gpu-memory-util=0.8"], "--gpu-memory-utilization", 0.8),
    ("vllm", ["--tensor-parallel", "2"], "--tensor-parallel-size", 2),
    ("vllm", ["--max_model", "4096"], "--max-model-len", 4096),
    ("sglang", ["--mem-fraction", "0.7"], "--mem-fraction-static", 0.7),
    ("sglang", ["--context-len", "4096"], "--context-length", 4096),
])
def test_an_abbreviated_flag_is_pinned_as_the_flag_argparse_reads(engine: str, argv: list[str], flag: str,
                                                                   value: object) -> None:
    """Both engines' parsers take a unique prefix of a long option (allow_abbrev): `--max-model 8192` is
    pinned, so the plan neither adds a second --max-model-len after it (argparse's last would win) nor
    plans another length."""
    assert adapter(engine).pin(argv).values[flag] == value


def test_an_abbreviated_flag_is_not_overridden_in_the_command_line() -> None:
    code, out, err = run(["serve", "qwen2.5-7b", "--engine", "vllm", "--gpu", "h100", "--dry-run", "--",
                          "--max-model", "8192", "--gpu-memory-util", "0.8"])
    assert code == 0, err
    command = out.strip().splitlines()[-1]
    assert command.endswith("--max-model 8192 --gpu-memory-util 0.8")
    assert "--max-model-len" not in command and "--gpu-memory-utilization" not in command


def test_a_prefix_of_several_flags_is_not_read_as_one() -> None:
    pinned = adapter("vllm").pin(["--max-num", "64"]).values
    assert "--max-num-seqs" not in pinned and "--max-num-batched-tokens" not in pinned


def test_a_negated_vllm_switch_turns_the_flag_off_where_it_comes_last() -> None:
    """vLLM's boolean flags are BooleanOptionalAction: `--enforce-eager --no-enforce-eager` captures graphs
    (argparse's last wins), so the plan counts them; the other order does not."""
    vllm = adapter("vllm")
    assert vllm.pin(["--enforce-eager", "--no-enforce-eager"]).values["--enforce-eager"] is False
    assert vllm.pin(["--no-enforce-eager", "--enforce-eager"]).values["--enforce-eager"] is True
    assert vllm.pin(["-ep", "--no-enable-expert-parallel"]).values["--enable-expert-parallel"] is False
    assert vllm.pinned_as_written("--enforce-eager", False) == "--no-enforce-eager"
    code, out, err = run(["plan", "qwen2.5-7b", "--engine", "vllm", "--gpu", "h100", "--", "--enforce-eager",
                          "--no-enforce-eager"])
    assert code == 0, err
    assert "51 PIECEWISE + 51 FULL graphs" in out and "pinned (kept)  --no-enforce-eager" in out
    code, out, _ = run(["plan", "qwen2.5-7b", "--engine", "vllm", "--gpu", "h100", "--", "--enable-lora",
                        "--no-enable-lora"])
    assert code == 0 and "LoRA" not in out
