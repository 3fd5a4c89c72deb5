"""Static validation of the pipeline's deployment files (``ingest`` and ``gateway``), as for the workers.

``deploy/kubernetes/pipeline/`` and ``deploy/compose/pipeline.yaml``: strict Kubernetes schemas,
the Compose Specification, and cross-checks against the CLI (every ``DERENDER_*`` name is a flag of
the command that reads it, and its value parses), against the workers' own files (topic names), and
among the objects (probes, PodDisruptionBudgets, topology spread and NetworkPolicies select the pods
and ports that exist).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import kubernetes_validate.utils as kv
import pytest
import yaml

from tests.deploy import tools
from tests.deploy.manifests import K8S_VERSIONS, YAMLLINT_CONFIG, yaml_docs
from tests.paths import REPO_ROOT
from worker.cli import build_parser
from worker.settings import GatewayOptions, IngestOptions, load

PIPELINE_K8S = REPO_ROOT / "deploy" / "kubernetes" / "pipeline"
VLLM_K8S = PIPELINE_K8S / "vllm"
WORKER_CONFIGMAP = REPO_ROOT / "deploy" / "kubernetes" / "configmap.yaml"
COMPOSE_DIR = REPO_ROOT / "deploy" / "compose"
PIPELINE_COMPOSE = COMPOSE_DIR / "pipeline.yaml"


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for path in sorted([*PIPELINE_K8S.glob("*.yaml"), *VLLM_K8S.glob("*.yaml")])
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
    assert kinds == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "Secret"}


def test_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    (kustomization,) = yaml_docs(PIPELINE_K8S / "kustomization.yaml")
    files = {p.name for p in PIPELINE_K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert set(kustomization["resources"]) == files
    (vllm,) = yaml_docs(VLLM_K8S / "kustomization.yaml")
    assert set(vllm["resources"]) == {p.name for p in VLLM_K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert vllm["namespace"] == "vllm"


def _gateway_configmap() -> dict[str, str]:
    return dict(_objects()[("ConfigMap", "derender-gateway")]["data"])


def _ingest_configmap() -> dict[str, str]:
    return dict(_objects()[("ConfigMap", "derender-ingest")]["data"])


def test_every_env_name_is_a_flag_of_the_command_that_reads_it() -> None:
    ingest, gateway = _flags("ingest"), _flags("gateway")
    assert sorted(set(_configmap()) - (ingest | gateway)) == []
    assert sorted(set(_gateway_configmap()) - gateway) == []
    assert sorted(set(_ingest_configmap()) - ingest) == []
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
    clean_env.setenv("DERENDER_API_KEY", "k1 k2")  # from the Secret
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


# ---- availability, probes, metrics ------------------------------------------------------------------


def _pod(name: str) -> dict[str, Any]:
    return dict(_objects()[("Deployment", f"derender-{name}")]["spec"]["template"])


@pytest.mark.parametrize("name", ["gateway", "ingest"])
def test_each_end_has_a_disruption_budget_and_spreads_over_nodes_and_zones(name: str) -> None:
    deployment = _objects()[("Deployment", f"derender-{name}")]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= _pod(name)["metadata"]["labels"].items()
    budget = _objects()[("PodDisruptionBudget", f"derender-{name}")]["spec"]
    assert budget["selector"]["matchLabels"] == selector
    # maxUnavailable, not minAvailable: a drain never blocks, whatever the replica count.
    assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget
    assert deployment["spec"]["replicas"] >= 2  # a budget of 1 keeps one serving
    spread = {c["topologyKey"]: c for c in _pod(name)["spec"]["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for constraint in spread.values():
        assert constraint["labelSelector"]["matchLabels"] == selector
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"  # a one-zone cluster still schedules


def test_ingest_probes_and_metrics_use_its_metrics_port(clean_env: pytest.MonkeyPatch) -> None:
    container = _container("ingest")
    (port,) = container["ports"]
    assert port["name"] == "metrics" and port["containerPort"] == int(_configmap()["DERENDER_METRICS_PORT"])
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe
    annotations = _pod("ingest")["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.io/path"] == "/metrics"
    # The flag ingest reads is the port the probes ask.
    from worker.settings import MetricsServerSettings

    clean_env.setenv("DERENDER_METRICS_PORT", _configmap()["DERENDER_METRICS_PORT"])
    assert (
        load(MetricsServerSettings, build_parser().parse_args(["ingest"])).metrics_port
        == port["containerPort"]
    )


def test_the_gateway_fails_closed_without_its_api_key_secret() -> None:
    env = {e["name"]: e for e in _container("gateway")["env"]}
    ref = env["DERENDER_API_KEY"]["valueFrom"]["secretKeyRef"]
    # Required: a missing Secret or key keeps the pod from starting instead of serving everyone.
    assert ref == {"name": "derender-pipeline", "key": "gateway-api-key"}
    secret = _objects()[("Secret", "derender-pipeline")]
    assert "gateway-api-key" in secret["stringData"]
    # ingest's vLLM key stays optional: vLLM may run without one.
    ingest = {e["name"]: e for e in _container("ingest")["env"]}
    assert ingest["DERENDER_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert ingest["DERENDER_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] in secret["stringData"]


def test_the_gateway_leaves_the_service_before_it_stops() -> None:
    pod = _pod("gateway")["spec"]
    pre_stop = _container("gateway")["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert 0 < pre_stop < pod["terminationGracePeriodSeconds"]


# ---- NetworkPolicies ---------------------------------------------------------------------------------


def _policy(name: str) -> dict[str, Any]:
    return dict(_objects()[("NetworkPolicy", name)]["spec"])


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return bool(selector["matchLabels"].items() <= labels.items())


def _ports(rule: dict[str, Any]) -> set[tuple[str | int, str]]:
    return {(p["port"], p["protocol"]) for p in rule["ports"]}


def _url_port(url: str) -> int:
    port = urllib.parse.urlsplit(url).port
    assert port is not None, url
    return port


def _dns_rule(rules: list[dict[str, Any]]) -> dict[str, Any]:
    (dns,) = [r for r in rules if (53, "UDP") in _ports(r)]
    assert _ports(dns) == {(53, "UDP"), (53, "TCP")}
    return dns


def test_the_gateway_takes_traffic_from_the_ingress_controller_and_talks_only_to_kafka() -> None:
    policy = _policy("derender-gateway")
    assert _selects(policy["podSelector"], _pod("gateway")["metadata"]["labels"])
    assert not _selects(policy["podSelector"], _pod("ingest")["metadata"]["labels"])
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    (ingress,) = policy["ingress"]
    (peer,) = ingress["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ingress-nginx"}
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "ingress-nginx"}
    (http,) = _container("gateway")["ports"]
    assert _ports(ingress) == {(http["name"], "TCP")}
    dns = _dns_rule(policy["egress"])
    others = [r for r in policy["egress"] if r is not dns]
    (kafka,) = others  # no vLLM: the gateway never calls it
    kafka_port = int(_configmap()["DERENDER_BOOTSTRAP_SERVERS"].rsplit(":", 1)[1])
    assert _ports(kafka) == {(kafka_port, "TCP")}
    assert kafka["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kafka"}


def test_ingest_takes_scrapes_from_prometheus_and_talks_to_vllm_and_kafka() -> None:
    policy = _policy("derender-ingest")
    assert _selects(policy["podSelector"], _pod("ingest")["metadata"]["labels"])
    assert not _selects(policy["podSelector"], _pod("gateway")["metadata"]["labels"])
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    (ingress,) = policy["ingress"]
    (peer,) = ingress["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert _ports(ingress) == {("metrics", "TCP")}
    dns = _dns_rule(policy["egress"])
    by_namespace = {
        r["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]: r
        for r in policy["egress"]
        if r is not dns
    }
    assert set(by_namespace) == {"vllm", "kafka"}
    env = _configmap()
    vllm_ports = {_url_port(env["DERENDER_RENDER_URL"]), _url_port(env["DERENDER_GENERATE_URL"])}
    assert _ports(by_namespace["vllm"]) == {(p, "TCP") for p in vllm_ports}
    assert by_namespace["vllm"]["to"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm"}
    kafka_port = int(env["DERENDER_BOOTSTRAP_SERVERS"].rsplit(":", 1)[1])
    assert _ports(by_namespace["kafka"]) == {(kafka_port, "TCP")}


def test_vllm_takes_traffic_from_ingest_only() -> None:
    ingest_policy = _policy("derender-ingest")
    (to_vllm,) = [
        r
        for r in ingest_policy["egress"]
        if "podSelector" in r["to"][0] and 53 not in {p["port"] for p in r["ports"]}
    ]
    policy = _policy("vllm-from-derender-ingest")
    # It selects the pods ingest's egress rule names, in vLLM's namespace.
    assert policy["podSelector"] == to_vllm["to"][0]["podSelector"]
    assert policy["policyTypes"] == ["Ingress"]
    (ingress,) = policy["ingress"]
    (peer,) = ingress["from"]
    assert _selects(peer["podSelector"], _pod("ingest")["metadata"]["labels"])
    assert not _selects(peer["podSelector"], _pod("gateway")["metadata"]["labels"])
    assert "kubernetes.io/metadata.name" in peer["namespaceSelector"]["matchLabels"]
    assert _ports(ingress) == _ports(to_vllm)


def test_pipeline_yaml_passes_yamllint() -> None:
    from yamllint import linter as yamllint_linter
    from yamllint.config import YamlLintConfig

    config = YamlLintConfig(YAMLLINT_CONFIG)
    paths = sorted([*PIPELINE_K8S.glob("*.yaml"), *VLLM_K8S.glob("*.yaml")])
    problems = [
        f"{path.name}:{p.line}:{p.column} {p.message}"
        for path in paths
        for p in yamllint_linter.run(path.read_text(encoding="utf-8"), config, str(path))
    ]
    assert problems == []


# ---- rendered by the real tools -----------------------------------------------------------------------


@pytest.mark.parametrize("directory", [PIPELINE_K8S, VLLM_K8S], ids=["pipeline", "vllm"])
def test_kustomize_renders_the_objects_of_the_files(directory: Path) -> None:
    result = subprocess.run(
        [*tools.kustomize(), str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(result.stdout) if d}
    expected = {
        key
        for path in directory.glob("*.yaml")
        if path.name not in {"kustomization.yaml", "secret.example.yaml"}
        for key in ((d["kind"], d["metadata"]["name"]) for d in yaml_docs(path))
    }
    assert set(rendered) == expected
    for doc in rendered.values():
        kv.validate(doc, K8S_VERSIONS[-1], strict=True)
    if directory == VLLM_K8S:
        assert {d["metadata"]["namespace"] for d in rendered.values()} == {"vllm"}


def test_docker_compose_config_accepts_the_pipeline_file() -> None:
    # The pipeline file extends the workers' (compose.yaml): both are given, as the docs run them.
    command = [*tools.compose(), "-f", str(COMPOSE_DIR / "compose.yaml"), "-f", str(PIPELINE_COMPOSE)]
    result = subprocess.run(
        [*command, "config", "--quiet"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_run_builds_the_tool_versions_the_tests_name() -> None:
    script = (REPO_ROOT / "run").read_text(encoding="utf-8")
    for name in ("HELM_MODULE", "KUSTOMIZE_MODULE", "COMPOSE_MODULE"):
        assert f"{name}={getattr(tools, name)}\n" in script, name
    assert "ensure_deploy_tools\n" in script.split("tests)", 1)[1]


def test_the_gateway_limits_are_its_defaults_and_fit_its_pod(clean_env: pytest.MonkeyPatch) -> None:
    """The limits are written out with the gateway's defaults (a changed default shows here), and the
    pod reads them after the shared ConfigMap."""
    sources = [s["configMapRef"]["name"] for s in _container("gateway")["envFrom"]]
    assert sources == ["derender-pipeline", "derender-gateway"]  # the later one wins
    env = {**_configmap(), **_gateway_configmap(), "DERENDER_API_KEY": "k1 k2"}
    for name, value in env.items():
        clean_env.setenv(name, value)
    gateway = load(GatewayOptions, build_parser().parse_args(["gateway"]))
    assert gateway.api_keys == ("k1", "k2") and not gateway.allow_no_api_key
    written = {name: value for name, value in _gateway_configmap().items()}
    fields = GatewayOptions.model_fields
    for name in written:
        field = name.removeprefix("DERENDER_").lower()
        assert getattr(gateway, field) == fields[field].default, name
    pod = _pod("gateway")["spec"]
    pre_stop = _container("gateway")["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop + gateway.shutdown_timeout_s < pod["terminationGracePeriodSeconds"]
    memory = _container("gateway")["resources"]["limits"]["memory"]
    assert memory.endswith("Mi") and gateway.max_bytes_in_flight < int(memory[:-2]) * 2**20 / 2


def test_the_ingest_limits_are_its_defaults_and_fit_its_pod(clean_env: pytest.MonkeyPatch) -> None:
    """Every limit of ingest is written out with its default (a changed default shows here), read
    after the shared ConfigMap, and the backlog's bytes fit the pod's memory."""
    sources = [s["configMapRef"]["name"] for s in _container("ingest")["envFrom"]]
    assert sources == ["derender-pipeline", "derender-ingest"]  # the later one wins
    env = {**_configmap(), **_ingest_configmap()}
    for name, value in env.items():
        clean_env.setenv(name, value)
    ingest = load(IngestOptions, build_parser().parse_args(["ingest"]))
    fields = IngestOptions.model_fields
    limits = {"max_record_bytes", "max_inflight", "max_backlog", "max_backlog_bytes", "render_timeout_s"}
    limits |= {"generate_timeout_s", "headers_timeout_s", "stream_idle_timeout_s", "abort_grace_s"}
    written = {name.removeprefix("DERENDER_").lower() for name in env}
    assert sorted(limits - written) == []
    for field in limits:
        assert getattr(ingest, field) == fields[field].default, field
    memory = _container("ingest")["resources"]["limits"]["memory"]
    assert memory.endswith("Mi") and ingest.max_backlog_bytes <= int(memory[:-2]) * 2**20 / 2
