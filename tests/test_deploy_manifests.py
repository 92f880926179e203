"""Deployment files production-grade: non-root images, securityContext, every manifest validated
against Kubernetes' own schemas (kubernetes-validate ships them: offline), the multi-node example
planned by the CLI, and the unit's Documentation= installed by the wheel."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_deploy import DOCKERFILES, REPO, UNIT, dockerfile_instructions, parse_unit, serve_params, value

kubernetes_validate = pytest.importorskip("kubernetes_validate")
K8S_VERSION = "1.30.0"  # the oldest release the manifests promise (fsGroupChangePolicy, seccompProfile)
MANIFESTS = (REPO / "deploy" / "kubernetes.yaml", REPO / "deploy" / "kubernetes-multinode.yaml")
UID = 10001


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def as_pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A LeaderWorkerSet's templates as Pods (its CRD schema is not in Kubernetes' own set)."""
    lws = doc["spec"]["leaderWorkerTemplate"]
    return [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{doc['metadata']['name']}-{role}",
                                                           **lws[f"{role}Template"].get("metadata", {})},
             "spec": lws[f"{role}Template"]["spec"]} for role in ("leader", "worker")]


def pod_specs(path: Path) -> list[dict[str, Any]]:
    specs = []
    for doc in documents(path):
        if doc["kind"] == "Deployment":
            specs.append(doc["spec"]["template"]["spec"])
        elif doc["kind"] == "LeaderWorkerSet":
            specs.extend(pod["spec"] for pod in as_pods(doc))
    return specs


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifests_pass_kubernetes_schemas_strictly(path: Path) -> None:
    for doc in documents(path):
        for resource in as_pods(doc) if doc["kind"] == "LeaderWorkerSet" else [doc]:
            kubernetes_validate.validate(resource, K8S_VERSION, strict=True)


def test_validation_would_catch_a_typo() -> None:
    doc = documents(MANIFESTS[0])[1]
    doc["spec"]["template"]["spec"]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_pods_run_as_the_images_non_root_user(path: Path) -> None:
    for spec in pod_specs(path):
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == context["fsGroup"] == UID
        for container in spec["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_images_are_not_root_and_write_only_where_volumes_go(path: Path) -> None:
    instructions = dockerfile_instructions(path)
    users = [rest for word, rest in instructions if word == "USER"]
    assert users == [f"{UID}:{UID}"]
    run = " ".join(rest for word, rest in instructions if word == "RUN")
    assert f"--uid {UID}" in run and "chown safe-serve:safe-serve" in run
    env = " ".join(rest for word, rest in instructions if word == "ENV")
    for directory in ("/var/lib/safe-serve", "/var/cache/safe-serve", "/run/safe-serve"):
        assert directory in run.split("chown", 1)[1]
    assert "HOME=/var/lib/safe-serve" in env and "HF_HOME=/var/cache/safe-serve" in env


def _lws_args(args: list[str], worker_index: str) -> list[str]:
    values = {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": worker_index, "LWS_LEADER_ADDRESS": "leader.svc"}
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in args]


def test_multinode_every_rank_plans_its_share() -> None:
    """Leader and worker: one engine each, same pinned memory flags, each node's 8 of the 16 ranks."""
    [lws] = [d for d in documents(MANIFESTS[1]) if d["kind"] == "LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    flags = []
    for role, index in (("leader", "0"), ("worker", "1")):
        args = _lws_args(template[f"{role}Template"]["spec"]["containers"][0]["args"], index)
        params = serve_params(args)
        engine_args = list(params["engine_args"])
        assert engine_args[engine_args.index("--node-rank") + 1] == index
        memory = [engine_args[engine_args.index(f) + 1] for f in ("--mem-fraction-static", "--context-length")]
        flags.append(memory)
        argv = [sys.executable, "-m", "launcher", *args[:1], *args[1:args.index("--")], "--gpu", "8xh100",
                "--dry-run", "--json", *args[args.index("--"):]]
        if "--ready-file" in argv:  # its directory is the pod's: the flag and its value go together
            at = argv.index("--ready-file")
            del argv[at:at + 2]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        plan = yaml.safe_load(done.stdout)
        assert plan["gpu"]["count"] == 8 and plan["tensor_parallel_size"] == 16
    assert flags[0] == flags[1]  # SGLang needs identical memory flags on every node


def test_unit_documentation_is_installed_by_the_wheel(tmp_path: Path) -> None:
    """Documentation= names the file the wheel's data-files put under the unit's /opt/safe-serve prefix."""
    documentation = value(parse_unit(UNIT.read_text()), "Unit", "Documentation")
    prefix = "file:///opt/safe-serve/"
    assert documentation.startswith(prefix)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                            "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    if built.returncode != 0:
        pytest.skip(f"could not build the wheel here: {built.stderr[-300:]}")
    [wheel] = tmp_path.glob("safe_serve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    wanted = documentation.removeprefix(prefix)
    assert any(n.endswith(".data/data/" + wanted) for n in names), [n for n in names if ".data/" in n][:10]
    assert any(n.endswith("engines/vllm/argparse_flags.json") for n in names)
