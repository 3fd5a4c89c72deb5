"""Static validation of the pipeline's deployment files (``ingest`` and ``gateway``), as for the workers.

``deploy/kubernetes/pipeline/`` and ``deploy/compose/pipeline.yaml``: strict Kubernetes schemas,
the Compose Specification, and cross-checks against the CLI (every ``DERENDER_*`` name is a flag of
the command that reads it, and its value parses) and against the workers' own files (topic names).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

import kubernetes_validate.utils as kv
import pytest
import yaml

from tests.deploy.manifests import K8S_VERSIONS, yaml_docs
from tests.paths import REPO_ROOT
from worker.cli import build_parser
from worker.settings import GatewayOptions, IngestOptions, load

PIPELINE_K8S = REPO_ROOT / "deploy" / "kubernetes" / "pipeline"
WORKER_CONFIGMAP = REPO_ROOT / "deploy" / "kubernetes" / "configmap.yaml"
COMPOSE_DIR = REPO_ROOT / "deploy" / "compose"
PIPELINE_COMPOSE = COMPOSE_DIR / "pipeline.yaml"


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for path in sorted(PIPELINE_K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for d in yaml_docs(path)
    }


def _configmap() -> dict[str, str]:
    return dict(_objects()[("ConfigMap", "derender-pipeline")]["data"])


def _container(name: str) -> dict[str, Any]:
    (container,) = _objects()[("Deployment", f"derender-{name}")]["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _flags(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {
        "DERENDER_" + option[2:].replace("-", "_").upper()
        for action in sub._actions
        for option in action.option_strings
        if option.startswith("--")
    }


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_objects_are_strictly_valid(version: str) -> None:
    kinds = set()
    for (kind, name), doc in _objects().items():
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{kind}/{name} at {list(exc.path)}: {exc}")
        kinds.add(kind)
    assert kinds == {"ConfigMap", "Deployment", "Service"}


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = yaml_docs(PIPELINE_K8S / "kustomization.yaml")
    files = {p.name for p in PIPELINE_K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_every_env_name_is_a_flag_of_the_command_that_reads_it() -> None:
    ingest, gateway = _flags("ingest"), _flags("gateway")
    assert sorted(set(_configmap()) - (ingest | gateway)) == []
    for name, flags in (("ingest", ingest), ("gateway", gateway)):
        container = _container(name)
        assert container["args"] == [name]
        assert sorted({e["name"] for e in container["env"]} - flags) == []
    compose = yaml.safe_load(PIPELINE_COMPOSE.read_text(encoding="utf-8"))["services"]
    for name, flags in (("ingest", ingest), ("gateway", gateway)):
        assert compose[name]["command"] == [name]
        assert sorted(set(compose[name]["environment"]) - flags) == []


def test_manifest_values_reach_the_flags(clean_env: pytest.MonkeyPatch) -> None:
    env = _configmap()
    for name, value in env.items():
        clean_env.setenv(name, value)
    ingest = load(IngestOptions, build_parser().parse_args(["ingest"]))
    assert (ingest.requests_topic, ingest.input_topic, ingest.output_topic) == (
        env["DERENDER_REQUESTS_TOPIC"],
        env["DERENDER_INPUT_TOPIC"],
        env["DERENDER_OUTPUT_TOPIC"],
    )
    assert ingest.render_url == env["DERENDER_RENDER_URL"] and ingest.max_inflight == 256
    gateway = load(GatewayOptions, build_parser().parse_args(["gateway"]))
    (port,) = _container("gateway")["ports"]
    assert gateway.port == port["containerPort"] == int(env["DERENDER_PORT"])
    assert gateway.served_model_names == (env["DERENDER_SERVED_MODEL_NAME"],)


def test_topics_are_the_workers() -> None:
    (worker,) = yaml_docs(WORKER_CONFIGMAP)
    for name in ("DERENDER_INPUT_TOPIC", "DERENDER_OUTPUT_TOPIC", "DERENDER_BOOTSTRAP_SERVERS"):
        assert _configmap()[name] == worker["data"][name], name
    compose_worker = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text(encoding="utf-8"))["services"][
        "worker"
    ]
    compose = yaml.safe_load(PIPELINE_COMPOSE.read_text(encoding="utf-8"))["services"]
    for service in ("ingest", "gateway"):
        env = compose[service]["environment"]
        for name in ("DERENDER_OUTPUT_TOPIC", "DERENDER_BOOTSTRAP_SERVERS"):
            assert env[name] == compose_worker["environment"][name], (service, name)
    assert (
        compose["ingest"]["environment"]["DERENDER_INPUT_TOPIC"]
        == compose_worker["environment"]["DERENDER_INPUT_TOPIC"]
    )
    assert (
        compose["ingest"]["environment"]["DERENDER_REQUESTS_TOPIC"]
        == compose["gateway"]["environment"]["DERENDER_REQUESTS_TOPIC"]
    )


def test_probes_and_service_reach_the_gateway_port() -> None:
    container = _container("gateway")
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = _objects()[("Service", "derender-gateway")]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pod_labels = _objects()[("Deployment", "derender-gateway")]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == pod_labels


def test_ingest_gets_longer_than_its_shutdown_timeout() -> None:
    grace = _objects()[("Deployment", "derender-ingest")]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert grace > float(_configmap()["DERENDER_SHUTDOWN_TIMEOUT_S"])


def test_compose_file_matches_the_compose_specification() -> None:
    command = [
        sys.executable,
        "-m",
        "check_jsonschema",
        "--builtin-schema",
        "vendor.compose-spec",
        str(PIPELINE_COMPOSE),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
