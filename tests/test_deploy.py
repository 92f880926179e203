"""Deployment files: the systemd unit (systemd-analyze verify + content), the env file, the
Dockerfiles and the Kubernetes manifest, each checked against the CLI it drives.

The sd_notify datagram protocol itself is covered in tests/test_supervisor.py (TestSdnotify).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.common.errors import ExitCode
from launcher.common.paths import state_dir
from launcher.edge.cli import cli

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "safe-serve@.service"
EXAMPLE_ENV = REPO / "systemd" / "example.env"
DOCKERFILES = (REPO / "deploy" / "Dockerfile", REPO / "deploy" / "Dockerfile.sglang")
KUBERNETES = REPO / "deploy" / "kubernetes.yaml"
SERVE = cli.commands["serve"]


# --------------------------------------------------------------------------- helpers


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as ordered (key, value) lists: keys may repeat (DeviceAllow=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"assignment outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: Mapping[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    """Every value of `key`, with systemd's rule that an empty assignment resets the list."""
    out: list[str] = []
    for k, v in unit.get(section, []):
        if k == key:
            out = [] if v == "" else [*out, v]
    return out


def value(unit: Mapping[str, list[tuple[str, str]]], section: str, key: str) -> str:
    found = values(unit, section, key)
    assert found, f"[{section}] {key}= is not set"
    return found[-1]


def seconds(span: str) -> float:
    """A systemd time span (`90s`, `15min`, `1h`, `2min 30s`, `45`) in seconds."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*([a-z]*)", span):
        total += float(number) * units[unit or "s"]
    return total


def unit_environment(unit: Mapping[str, list[tuple[str, str]]]) -> dict[str, str]:
    """Environment= assignments (each may hold several quoted NAME=value words)."""
    env: dict[str, str] = {}
    for assignment in values(unit, "Service", "Environment"):
        for word in shlex.split(assignment):
            name, _, val = word.partition("=")
            env[name] = val
    return env


def read_env_file(path: Path) -> dict[str, str]:
    """The simple subset of systemd's EnvironmentFile= syntax that example.env uses."""
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        name, _, val = line.partition("=")
        assert not val.startswith(("'", '"')), f"{name}: keep example values unquoted"
        env[name.strip()] = val.strip()
    return env


def expand_exec(command: str, env: Mapping[str, str]) -> list[str]:
    """systemd's ExecStart= expansion: `${VAR}` is one word, a lone `$VAR` is split at whitespace
    with quotes respected (systemd.service(5), "Command lines"); checked against systemd 252
    running this unit, where `--served-model-name "qwen 7b"` arrived as one argument."""
    argv: list[str] = []
    for word in shlex.split(command):
        lone = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if lone:
            argv += shlex.split(env.get(lone.group(1), ""))
        else:
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


def serve_params(args: Sequence[str]) -> dict[str, Any]:
    """Parse `safe-serve serve ...` arguments as the CLI would, without running anything."""
    assert args[0] == "serve", args
    with SERVE.make_context("serve", list(args[1:]), resilient_parsing=False) as ctx:
        return dict(ctx.params)


def serve_option_names() -> set[str]:
    return {opt for param in SERVE.params for opt in getattr(param, "opts", ()) if opt.startswith("--")}


def engine_args_of(params: Mapping[str, Any]) -> list[str]:
    args = list(params.get("engine_args") or ())
    return args[1:] if args[:1] == ["--"] else args


@pytest.fixture(scope="module")
def unit() -> dict[str, list[tuple[str, str]]]:
    return parse_unit(UNIT.read_text())


# --------------------------------------------------------------------------- systemd-analyze verify


def _verify(unit_path: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian/Ubuntu: apt-get install -y systemd)")
    return subprocess.run([analyze, "verify", "--man=no", str(unit_path)], capture_output=True, text=True,
                          timeout=60, check=False)


def _problems(result: subprocess.CompletedProcess[str], unit_name: str) -> list[str]:
    """verify exits 0 on unknown keys and unparsable values: read what it says about our file."""
    stem = unit_name.split("@")[0]
    return [line for line in (result.stdout + result.stderr).splitlines()
            if stem in line or re.search(r"Unknown (key|section)|Failed to parse|not executable|ignoring", line)]


@pytest.mark.parametrize("name", ["safe-serve@.service", "safe-serve@qwen2.5-7b.service"])
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path, name: str) -> None:
    """The template and an instance of it load cleanly (ExecStart's /usr/bin/env exists everywhere)."""
    copy = tmp_path / name
    shutil.copyfile(UNIT, copy)
    result = _verify(copy)
    assert (result.returncode, _problems(result, name)) == (0, []), result.stdout + result.stderr


def test_systemd_analyze_verify_would_catch_a_typo(tmp_path: Path) -> None:
    """Control: a misspelt key only warns (exit 0), and the check above sees that warning."""
    copy = tmp_path / "safe-serve@typo.service"
    copy.write_text(UNIT.read_text().replace("KillMode=mixed", "KilMode=mixed"))
    result = _verify(copy)
    assert any("KilMode" in line for line in _problems(result, copy.name)), result.stdout + result.stderr


# --------------------------------------------------------------------------- unit content


class TestUnit:
    def test_notify_type_and_access(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        """Only safe-serve (the main PID, exec'd by /usr/bin/env) talks to systemd."""
        assert (value(unit, "Service", "Type"), value(unit, "Service", "NotifyAccess")) == ("notify", "main")

    def test_exec_start_shape(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        """Model and engine are one word each; the two flag lists split; engine flags after `--`."""
        assert value(unit, "Service", "ExecStart") == (
            "/usr/bin/env safe-serve serve ${SAFE_SERVE_MODEL} --engine ${SAFE_SERVE_ENGINE} "
            "$SAFE_SERVE_ARGS -- $ENGINE_ARGS")
        assert values(unit, "Service", "EnvironmentFile")[-1] == "/etc/safe-serve/%i.env"

    def test_restart_policy_follows_the_exit_codes(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        """78 (won't fit) and 2 (usage) are final; 75 (GPU busy) is retried."""
        prevent = {int(code) for code in value(unit, "Service", "RestartPreventExitStatus").split()}
        assert value(unit, "Service", "Restart") == "on-failure"
        assert {int(ExitCode.CONFIG), int(ExitCode.USAGE)} <= prevent
        assert int(ExitCode.TEMPFAIL) not in prevent and int(ExitCode.UNAVAILABLE) not in prevent
        assert seconds(value(unit, "Service", "RestartSec")) >= 5
        assert int(value(unit, "Unit", "StartLimitBurst")) >= 2
        assert seconds(value(unit, "Unit", "StartLimitIntervalSec")) >= 600

    def test_stop_leaves_room_for_the_grace_period(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        """safe-serve stops the engine group itself; systemd's SIGKILL comes only after --grace."""
        grace = serve_params(["serve", "m"])["grace"]
        assert value(unit, "Service", "KillMode") == "mixed"
        assert value(unit, "Service", "KillSignal") == "SIGTERM"
        assert seconds(value(unit, "Service", "TimeoutStopSec")) >= float(grace) + 15

    def test_start_timeout_is_sized_for_loading(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        assert seconds(value(unit, "Service", "TimeoutStartSec")) >= 10 * 60

    def test_identity_and_writable_directories(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        """A fixed user; state where safe-serve looks ($STATE_DIRECTORY); caches under CacheDirectory."""
        env = unit_environment(unit)
        assert value(unit, "Service", "User") == "safe-serve" and value(unit, "Service", "Group") == "safe-serve"
        assert values(unit, "Service", "DynamicUser") in ([], ["no"])
        state = value(unit, "Service", "StateDirectory")
        assert state_dir({"STATE_DIRECTORY": f"/var/lib/{state}"}) == Path(f"/var/lib/{state}")
        cache = Path("/var/cache") / value(unit, "Service", "CacheDirectory")
        assert Path(env["HF_HOME"]).is_relative_to(cache)
        assert env["SAFE_SERVE_ENGINE"] == "vllm"

    def test_start_locks_are_shared_between_instances(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        """PrivateTmp would split /tmp per instance: the lock dir is a preserved RuntimeDirectory."""
        lock_dir = unit_environment(unit)["SAFE_SERVE_LOCK_DIR"]
        runtime = [f"/run/{d}" for v in values(unit, "Service", "RuntimeDirectory") for d in v.split()]
        assert lock_dir in runtime and not lock_dir.startswith("/tmp")
        assert value(unit, "Service", "RuntimeDirectoryPreserve") == "yes"
        assert value(unit, "Service", "RuntimeDirectoryMode") == "1777"

    def test_hardening_that_still_runs_cuda(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        expected = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "ProtectHome": "yes",
                    "DevicePolicy": "closed", "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes",
                    "RestrictSUIDSGID": "yes", "LockPersonality": "yes", "SystemCallArchitectures": "native",
                    "MemoryDenyWriteExecute": "no"}
        assert {key: value(unit, "Service", key) for key in expected} == expected
        assert values(unit, "Service", "PrivateDevices") in ([], ["no"]), "PrivateDevices hides /dev/nvidia*"
        allowed = {entry.split()[0]: entry.split()[1] for entry in values(unit, "Service", "DeviceAllow")}
        assert allowed.get("char-nvidia-uvm") == "rw"
        assert "rw" in (allowed.get("char-nvidia-frontend"), allowed.get("char-nvidia"))
        assert all(not spec.startswith("/dev/") or "*" not in spec for spec in allowed), "no globs in paths"


# --------------------------------------------------------------------------- env file -> command line


class TestEnvFile:
    def test_example_env_gives_a_command_line_the_cli_accepts(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        """Unit defaults + example.env, expanded as systemd does, parse as `safe-serve serve`;
        no safe-serve option leaks into the engine's flags."""
        file_env = read_env_file(EXAMPLE_ENV)
        env = {**unit_environment(unit), **file_env}
        argv = expand_exec(value(unit, "Service", "ExecStart"), env)
        assert argv[:2] == ["/usr/bin/env", "safe-serve"]
        params = serve_params(argv[2:])
        assert params["model"] == file_env["SAFE_SERVE_MODEL"] and params["engine"] == file_env["SAFE_SERVE_ENGINE"]
        assert engine_args_of(params) == shlex.split(file_env["ENGINE_ARGS"])

    def test_minimal_env_file_uses_the_defaults(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        """Only SAFE_SERVE_MODEL set: engine vllm, no flags, a harmless bare `--`."""
        env = {**unit_environment(unit), "SAFE_SERVE_MODEL": "/srv/models/qwen"}
        argv = expand_exec(value(unit, "Service", "ExecStart"), env)
        assert argv[2:] == ["serve", "/srv/models/qwen", "--engine", "vllm", "--"]
        params = serve_params(argv[2:])
        assert (params["engine"], engine_args_of(params)) == ("vllm", [])

    def test_quoted_words_stay_one_argument(self, unit: dict[str, list[tuple[str, str]]]) -> None:
        env = {**unit_environment(unit), "SAFE_SERVE_MODEL": "m",
               "SAFE_SERVE_ARGS": '--engine-cmd "python3 -m vllm.entrypoints.openai.api_server"',
               "ENGINE_ARGS": '--served-model-name "qwen 7b"'}
        params = serve_params(expand_exec(value(unit, "Service", "ExecStart"), env)[2:])
        assert params["engine_cmd"] == "python3 -m vllm.entrypoints.openai.api_server"
        assert engine_args_of(params) == ["--served-model-name", "qwen 7b"]

    def test_every_serve_option_is_documented(self) -> None:
        """example.env lists safe-serve's serve options (those that make sense in a unit)."""
        text = EXAMPLE_ENV.read_text()
        missing = sorted(opt for opt in serve_option_names() - {"--engine", "--gpu", "--json", "--dry-run", "--help"}
                         if not re.search(rf"^#\s+{re.escape(opt)}\b", text, re.MULTILINE))
        assert missing == []


# --------------------------------------------------------------------------- containers


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        pending += raw.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
class TestDockerfiles:
    def test_base_image_entrypoint_and_signal(self, path: Path) -> None:
        instructions = dockerfile_instructions(path)
        args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
        base = next(rest for word, rest in instructions if word == "FROM")
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        assert image in ("vllm/vllm-openai:v0.32.0", "lmsysorg/sglang:v0.5.23")
        assert dict(instructions)["ENTRYPOINT"] == '["safe-serve"]'
        assert dict(instructions)["STOPSIGNAL"] == "SIGTERM"

    def test_copied_sources_exist(self, path: Path) -> None:
        """The build context is the repository root; everything COPY names is there."""
        for word, rest in dockerfile_instructions(path):
            if word == "COPY":
                for source in rest.split()[:-1]:
                    assert (REPO / source).exists(), source

    def test_cmd_parses_and_matches_the_healthcheck(self, path: Path) -> None:
        """CMD is a valid `safe-serve serve`; the health check reads the ready file CMD writes."""
        instructions = dict(dockerfile_instructions(path))
        cmd = yaml.safe_load(instructions["CMD"])
        params = serve_params(cmd)
        assert params["ready_file"] and params["ready_file"] in instructions["HEALTHCHECK"]
        assert "/health" in instructions["HEALTHCHECK"] and "--start-period=" in instructions["HEALTHCHECK"]
        assert "--host" in engine_args_of(params)


@pytest.fixture(scope="module", name="docs")
def _kubernetes_docs() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(KUBERNETES.read_text()) if doc]


@pytest.fixture(scope="module", name="pod")
def _kubernetes_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(doc for doc in docs if doc["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]


class TestKubernetes:

    def test_manifest_parses(self, docs: list[dict[str, Any]]) -> None:
        assert sorted(doc["kind"] for doc in docs) == ["Deployment", "PersistentVolumeClaim", "Service"]

    def test_one_gpu_and_a_parsable_command(self, pod: dict[str, Any]) -> None:
        container = pod["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        params = serve_params(container["args"])
        assert params["ready_file"] == "/run/safe-serve/ready"

    def test_probes_and_grace(self, pod: dict[str, Any]) -> None:
        """Startup budget >= 20 min and >= --watch-timeout; readiness = the ready file; grace > --grace."""
        container = pod["containers"][0]
        params = serve_params(container["args"])
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= max(20 * 60, params["watch_timeout"])
        assert container["readinessProbe"]["exec"]["command"] == ["test", "-f", params["ready_file"]]
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        assert pod["terminationGracePeriodSeconds"] > params["grace"]
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts[str(Path(params["ready_file"]).parent)]]
