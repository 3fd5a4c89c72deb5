"""The Helm chart in ``deploy/helm/derender-worker``: ``helm lint`` and ``helm template`` with default and
non-default values, and the rendered manifests validated as ``tests/deploy/test_manifests.py`` validates
``deploy/kubernetes`` (strict Kubernetes schemas, the KEDA schemas, every ``DERENDER_*`` name a flag of
``run``). With default values the chart renders the objects of ``deploy/kubernetes``.

helm comes from PATH or from ``go install`` (``$(go env GOPATH)/bin``; ``./run tests`` builds it there);
without it these tests fail, saying how to get it (``tests/deploy/tools.py``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate.utils as kv
import pytest
import yaml

from tests.deploy import tools
from tests.deploy.helm_render import strip_release
from tests.deploy.manifests import (
    K8S_VERSIONS,
    NON_FLAG_ENV,
    YAMLLINT_CONFIG,
    command_parser,
    flag_env_names,
    k8s_objects,
    schema_errors,
)
from tests.paths import REPO_ROOT

CHART = REPO_ROOT / "deploy" / "helm" / "derender-worker"

CUSTOM_VALUES: dict[str, Any] = {
    "image": {"repository": "registry.example/derender-worker", "tag": "1.2.3"},
    "modelImage": {"enabled": False},
    "model": {
        "tokenizer": "/opt/model",
        "servedModelName": "llama",
        "reasoningParser": None,
        "toolParser": "llama3_json",
        "enableAutoToolChoice": True,
        "maxModelLen": 8192,
        "maxLiveParsers": 5000,
    },
    "kafka": {
        "bootstrapServers": "b-1.msk.example:9098",
        "groupId": "derender-prod",
        "topics": {"input": "in", "output": "out", "state": "state", "deadLetters": "dlq"},
        "partitions": 24,
    },
    "caps": {"maxOpenRequests": 50000, "maxStateBytes": 268435456},
    "security": {
        "protocol": "SASL_SSL",
        "saslMechanism": "OAUTHBEARER",
        "existingSecret": "kafka-oauth",
        "oauth": {"tokenEndpoint": "https://idp.example/token", "clientId": "derender", "scope": "kafka"},
        "cafile": "/etc/derender-worker/kafka-tls/ca.crt",
    },
    "tracing": {"otelEndpoint": "http://otel-collector:4318"},
    "extraEnv": {"DERENDER_DLQ_MAX_RATIO": "0.2"},
    "keda": {"enabled": False},
    "replicaCount": 3,
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "strimzi": {"enabled": True, "cluster": "prod"},
}


@pytest.fixture(scope="module")
def helm() -> str:
    return tools.helm()


def _values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


@functools.cache
def _render_cached(helm: str, release: str, values_text: str | None) -> tuple[int, str, str]:
    args = [helm, "template", release, str(CHART), "--namespace", "inference"]
    tmp = None
    if values_text is not None:
        tmp = (
            Path(tempfile.gettempdir()) / f"derender-helm-values-{os.getpid()}-{abs(hash(values_text))}.yaml"
        )
        tmp.write_text(values_text, encoding="utf-8")
        args += ["--values", str(tmp)]
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return result.returncode, result.stdout, result.stderr


def _render(
    helm: str, values: dict[str, Any] | None = None, release: str = "derender-worker"
) -> list[dict[str, Any]]:
    code, out, err = _render_cached(helm, release, yaml.safe_dump(values) if values is not None else None)
    assert code == 0, err
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def _validate(docs: list[dict[str, Any]]) -> None:
    """Strict Kubernetes schemas for core kinds, the KEDA schema for ScaledObjects."""
    for doc in docs:
        kind = doc["kind"]
        if kind == "ScaledObject":
            assert schema_errors("ScaledObject", doc) == [], doc["metadata"]["name"]
        elif doc["apiVersion"].startswith(("kafka.strimzi.io/", "monitoring.coreos.com/")):
            continue  # CRDs without an offline schema: checked field by field below
        else:
            for version in K8S_VERSIONS:
                try:
                    kv.validate(doc, version, strict=True)
                except kv.ValidationError as exc:
                    pytest.fail(
                        f"{kind}/{doc['metadata']['name']} at {list(exc.path)} (k8s {version}): {exc}"
                    )


def _worker_env_names(docs: list[dict[str, Any]]) -> set[str]:
    kinds = _by_kind(docs)
    names = set(kinds["ConfigMap"][0]["data"])
    [deployment] = kinds["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    names |= {e["name"] for e in container.get("env", [])}
    return names


def _check_env_names(docs: list[dict[str, Any]]) -> None:
    run = command_parser("run")
    assert run is not None
    flags = set(flag_env_names(run))
    unknown = {n for n in _worker_env_names(docs) if n not in NON_FLAG_ENV} - flags
    assert not unknown, f"not flags of `derender-worker run`: {sorted(unknown)}"


# --- tests -----------------------------------------------------------------------------------------


def test_helm_lint(helm: str, tmp_path: Path) -> None:
    for extra in ([], ["--values", str(_values_file(tmp_path, CUSTOM_VALUES))]):
        result = subprocess.run(
            [helm, "lint", "--strict", str(CHART), *extra],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_default_values_render_deploy_kubernetes(helm: str) -> None:
    docs = _render(helm)
    _validate(docs)
    _check_env_names(docs)
    rendered = {(d["kind"], d["metadata"]["name"]): strip_release(d) for d in docs}
    expected = {
        key: strip_release(doc)
        for key, doc in k8s_objects().items()
        if key[0] not in {"Secret", "TriggerAuthentication"}
    }
    assert set(rendered) == set(expected)
    for key, doc in expected.items():
        assert rendered[key] == doc, f"{key} differs from deploy/kubernetes"


def test_non_default_values(helm: str) -> None:
    docs = _render(helm, CUSTOM_VALUES, release="prod")
    _validate(docs)
    _check_env_names(docs)
    kinds = _by_kind(docs)
    assert "ScaledObject" not in kinds
    [deployment] = kinds["Deployment"]
    assert deployment["metadata"]["name"] == "prod-derender-worker"
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    assert "initContainers" not in pod and {v["name"] for v in pod["volumes"]} == {"tmp", "kafka-tls"}
    [container] = pod["containers"]
    assert container["image"] == "registry.example/derender-worker:1.2.3"
    env = {e["name"]: e for e in container["env"]}
    assert env["DERENDER_SASL_OAUTH_CLIENT_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "kafka-oauth",
        "key": "oauth-client-secret",
    }
    assert "DERENDER_SASL_PASSWORD" not in env
    data = kinds["ConfigMap"][0]["data"]
    assert data["DERENDER_SASL_MECHANISM"] == "OAUTHBEARER"
    assert data["DERENDER_SASL_OAUTH_TOKEN_ENDPOINT"] == "https://idp.example/token"
    assert data["DERENDER_MAX_STATE_BYTES"] == "268435456"
    assert data["DERENDER_MAX_OPEN_REQUESTS"] == "50000"
    assert data["DERENDER_OTEL_ENDPOINT"] == "http://otel-collector:4318"
    assert data["DERENDER_DLQ_MAX_RATIO"] == "0.2"
    assert "DERENDER_REASONING_PARSER" not in data and data["DERENDER_TOOL_PARSER"] == "llama3_json"
    # The settings parse as the worker would read them.
    run = command_parser("run")
    assert run is not None

    [monitor] = kinds["ServiceMonitor"]
    [service] = kinds["Service"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}

    topics = {t["spec"]["topicName"]: t for t in kinds["KafkaTopic"]}
    assert set(topics) == {"in", "out", "state", "dlq"}
    assert all(
        t["spec"]["partitions"] == 24 and t["metadata"]["labels"]["strimzi.io/cluster"] == "prod"
        for t in topics.values()
    )
    assert topics["state"]["spec"]["config"]["cleanup.policy"] == "compact"
    assert topics["out"]["spec"]["config"]["max.message.bytes"] == "16777216"
    [user] = kinds["KafkaUser"]
    acls = {
        (a["resource"]["type"], a["resource"].get("name"), a["resource"].get("patternType")): set(
            a["operations"]
        )
        for a in user["spec"]["authorization"]["acls"]
    }
    assert acls[("transactionalId", "derender-prod-in-", "prefix")] >= {"Write", "Describe"}
    assert acls[("group", "derender-prod", "literal")] >= {"Read"}
    assert acls[("topic", "in", "literal")] >= {"Read"} and "Write" not in acls[("topic", "in", "literal")]
    for topic in ("out", "state", "dlq"):
        assert "Write" in acls[("topic", topic, "literal")]
    assert acls[("topic", "state", "literal")] >= {"Read"}


def test_keda_never_scales_past_the_partitions(helm: str) -> None:
    docs = _render(helm, {"kafka": {"partitions": 6}})
    [scaled] = _by_kind(docs)["ScaledObject"]
    assert scaled["spec"]["maxReplicaCount"] == 6
    assert scaled["metadata"]["annotations"]["derender-worker/input-topic-partitions"] == "6"
    code, _, err = _render_cached(helm, "x", yaml.safe_dump({"keda": {"maxReplicaCount": 13}}))
    assert code != 0 and "must not exceed kafka.partitions" in err


def test_msk_iam_mounts_the_service_account_token(helm: str) -> None:
    values = {
        "security": {"protocol": "SASL_SSL", "saslMechanism": "AWS_MSK_IAM", "awsRegion": "eu-west-1"},
        "serviceAccount": {"name": "derender-msk"},
    }
    docs = _render(helm, values)
    _validate(docs)
    _check_env_names(docs)
    [deployment] = _by_kind(docs)["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True and pod["serviceAccountName"] == "derender-msk"
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert env == {"DERENDER_CLIENT_ID", "POD_NAME"}
    assert _by_kind(docs)["ConfigMap"][0]["data"]["DERENDER_AWS_REGION"] == "eu-west-1"


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
