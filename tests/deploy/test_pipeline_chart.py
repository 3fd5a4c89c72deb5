"""The pipeline's Helm chart in ``deploy/helm/derender-pipeline``: ``helm lint``, ``helm template`` with
default and non-default values, the rendered objects validated as ``test_pipeline`` validates
``deploy/kubernetes/pipeline`` (strict Kubernetes schemas, every ``DERENDER_*`` name a flag of the
command that reads it). With default values and the release ``derender`` it renders exactly the
objects of ``deploy/kubernetes/pipeline`` (and of its ``vllm`` directory).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate.utils as kv
import pytest
import yaml

from tests.deploy import tools
from tests.deploy.helm_render import strip_release
from tests.deploy.manifests import K8S_VERSIONS, YAMLLINT_CONFIG, yaml_docs
from tests.deploy.test_pipeline import PIPELINE_K8S, VLLM_K8S, _flags
from tests.paths import REPO_ROOT

CHART = REPO_ROOT / "deploy" / "helm" / "derender-pipeline"

CUSTOM_VALUES: dict[str, Any] = {
    "image": {"repository": "registry.example/derender-worker", "tag": "1.2.3"},
    "kafka": {
        "bootstrapServers": "b-1.kafka.example:9093",
        "topics": {"requests": "req", "input": "in", "output": "out"},
        "partitions": 24,
    },
    "apiKeySecret": "gateway-keys",
    "ingest": {"groupId": "ingest-prod", "shutdownTimeoutS": 40, "terminationGracePeriodSeconds": 50},
    "gateway": {
        "replicaCount": 4,
        "port": 8080,
        "limits": {"headerTimeoutS": 2.5, "maxBodyBytes": 8388608},
    },
    "extraEnv": {"DERENDER_LOG_FORMAT": "json"},
    "networkPolicy": {"kafka": {"namespace": "strimzi", "port": 9093}, "vllm": {"restrictIngress": False}},
    "strimzi": {"enabled": True, "cluster": "prod"},
}


@pytest.fixture(scope="module")
def helm() -> str:
    return tools.helm()


def _render(
    helm: str, values: dict[str, Any] | None = None, release: str = "derender", tmp: Path | None = None
) -> tuple[int, list[dict[str, Any]], str]:
    args = [helm, "template", release, str(CHART), "--namespace", "inference"]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values), encoding="utf-8")
        args += ["--values", str(path)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    docs = [d for d in yaml.safe_load_all(result.stdout) if d] if result.returncode == 0 else []
    return result.returncode, docs, result.stderr


def _validate(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        if doc["apiVersion"].startswith("kafka.strimzi.io/"):
            continue  # no offline schema: checked field by field
        for version in K8S_VERSIONS:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(
                    f"{doc['kind']}/{doc['metadata']['name']} at {list(exc.path)} (k8s {version}): {exc}"
                )


def _env_names_are_flags(docs: list[dict[str, Any]]) -> None:
    ingest, gateway = _flags("ingest"), _flags("gateway")
    configmaps = {
        d["metadata"]["name"].rsplit("-", 1)[1]: d["data"] for d in docs if d["kind"] == "ConfigMap"
    }
    assert sorted(set(configmaps["pipeline"]) - (ingest | gateway)) == []
    assert sorted(set(configmaps["gateway"]) - gateway) == []
    for doc in docs:
        if doc["kind"] == "Deployment":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            flags = ingest if container["args"] == ["ingest"] else gateway
            assert sorted({e["name"] for e in container["env"]} - flags) == []


def _kustomize_objects() -> dict[tuple[str, str], dict[str, Any]]:
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for directory in (PIPELINE_K8S, VLLM_K8S):
        (kustomization,) = yaml_docs(directory / "kustomization.yaml")
        for name in kustomization["resources"]:
            for doc in yaml_docs(directory / name):
                if "namespace" in kustomization:
                    doc["metadata"]["namespace"] = kustomization["namespace"]
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def test_helm_lint(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(CUSTOM_VALUES), encoding="utf-8")
    for extra in ([], ["--values", str(values)]):
        result = subprocess.run(
            [helm, "lint", "--strict", str(CHART), *extra],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_default_values_render_deploy_kubernetes_pipeline(helm: str) -> None:
    code, docs, err = _render(helm)
    assert code == 0, err
    _validate(docs)
    _env_names_are_flags(docs)
    rendered = {(d["kind"], d["metadata"]["name"]): strip_release(d) for d in docs}
    expected = {key: strip_release(doc) for key, doc in _kustomize_objects().items()}
    assert set(rendered) == set(expected)
    for key, doc in expected.items():
        assert rendered[key] == doc, f"{key} differs from deploy/kubernetes/pipeline"


def test_non_default_values(helm: str, tmp_path: Path) -> None:
    code, docs, err = _render(helm, CUSTOM_VALUES, release="prod", tmp=tmp_path)
    assert code == 0, err
    _validate(docs)
    _env_names_are_flags(docs)
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert ("NetworkPolicy", "vllm-from-prod-ingest") not in by_key
    gateway = by_key[("Deployment", "prod-gateway")]
    assert gateway["spec"]["replicas"] == 4
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/derender-worker:1.2.3"
    env = {e["name"]: e for e in container["env"]}
    assert env["DERENDER_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "gateway-keys",
        "key": "gateway-api-key",
    }
    assert container["ports"][0]["containerPort"] == 8080
    data = by_key[("ConfigMap", "prod-pipeline")]["data"]
    assert (data["DERENDER_PORT"], data["DERENDER_LOG_FORMAT"], data["DERENDER_GROUP_ID"]) == (
        "8080",
        "json",
        "ingest-prod",
    )
    limits = by_key[("ConfigMap", "prod-gateway")]["data"]
    assert (limits["DERENDER_HEADER_TIMEOUT_S"], limits["DERENDER_MAX_BODY_BYTES"]) == ("2.5", "8388608")
    assert limits["DERENDER_MAX_BYTES_IN_FLIGHT"] == "201326592"  # a default: not 2.01326592e+08
    # Every selector selects the pods of this release only.
    for name in ("gateway", "ingest"):
        pod_labels = by_key[("Deployment", f"prod-{name}")]["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["app.kubernetes.io/instance"] == "prod"
        for kind in ("PodDisruptionBudget",):
            assert (
                by_key[(kind, f"prod-{name}")]["spec"]["selector"]["matchLabels"].items()
                <= pod_labels.items()
            )
        assert (
            by_key[("NetworkPolicy", f"prod-{name}")]["spec"]["podSelector"]["matchLabels"].items()
            <= pod_labels.items()
        )
    egress = by_key[("NetworkPolicy", "prod-ingest")]["spec"]["egress"]
    kafka = [r for r in egress if r["ports"][0]["port"] == 9093]
    assert kafka and kafka[0]["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "strimzi"
    }

    users = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KafkaUser"}
    assert set(users) == {"prod-ingest", "prod-gateway"}
    for user in users.values():
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == "prod"

    def acls(name: str) -> dict[tuple[str, str | None, str | None], set[str]]:
        return {
            (a["resource"]["type"], a["resource"].get("name"), a["resource"].get("patternType")): set(
                a["operations"]
            )
            for a in users[name]["spec"]["authorization"]["acls"]
        }

    ingest = acls("prod-ingest")
    assert ingest[("topic", "req", "literal")] >= {"Read", "Write"}  # requests, and its markers
    assert (
        ingest[("topic", "in", "literal")] >= {"Write"} and "Read" not in ingest[("topic", "in", "literal")]
    )
    assert ingest[("topic", "out", "literal")] >= {"Write"}  # error records
    assert ingest[("group", "ingest-prod", "literal")] >= {"Read"}
    # The transactional ids ingest uses: {group}-{requests topic}-{partition}.
    assert ingest[("transactionalId", "ingest-prod-req-", "prefix")] >= {"Write", "Describe"}
    gw = acls("prod-gateway")
    assert gw[("topic", "req", "literal")] >= {"Write"} and "Read" not in gw[("topic", "req", "literal")]
    assert gw[("topic", "out", "literal")] >= {"Read"} and "Write" not in gw[("topic", "out", "literal")]
    assert not any(kind == "transactionalId" for kind, _, _ in gw)
    # The replicas' membership group (docs/gateway.md#scaling-and-its-cost): joined, never committed.
    assert gw[("group", "derender-gateway", "literal")] >= {"Read"}
    (topic,) = [d for d in docs if d["kind"] == "KafkaTopic"]
    assert topic["spec"]["topicName"] == "req" and topic["spec"]["partitions"] == 24


def test_ingest_shutdown_must_fit_its_grace_period(helm: str, tmp_path: Path) -> None:
    values = {"ingest": {"shutdownTimeoutS": 60, "terminationGracePeriodSeconds": 60}}
    code, _, err = _render(helm, values, tmp=tmp_path)
    assert code != 0 and "shutdownTimeoutS must stay below" in err


def test_transactional_ids_match_ingest() -> None:
    """The ACL prefix is the one ingest's settings build, not a copy that can drift."""
    from worker.settings import IngestOptions

    options = IngestOptions(group_id="ingest-prod", requests_topic="req")
    assert options.transactional_id(3).startswith("ingest-prod-req-")


def test_chart_yaml_passes_yamllint() -> None:
    from yamllint import linter as yamllint_linter
    from yamllint.config import YamlLintConfig

    config = YamlLintConfig(YAMLLINT_CONFIG)
    problems = [
        f"{path.name}:{p.line}:{p.column} {p.message}"
        for path in (CHART / "Chart.yaml", CHART / "values.yaml")
        for p in yamllint_linter.run(path.read_text(encoding="utf-8"), config, str(path))
    ]
    assert problems == []


def test_gateway_shutdown_must_fit_its_grace_period(helm: str, tmp_path: Path) -> None:
    values = {"gateway": {"terminationGracePeriodSeconds": 25, "limits": {"shutdownTimeoutS": 20}}}
    code, _, err = _render(helm, values, tmp=tmp_path)
    assert code != 0 and "must stay below gateway.terminationGracePeriodSeconds" in err
