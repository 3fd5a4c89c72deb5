"""Shared harness of the deployment tests: the worker's Kubernetes objects, CLI flag names, KEDA schemas.

The worker's manifests are checked in ``test_manifests``; the Helm chart and the pipeline's files
are checked against the same Kubernetes versions, YAML rules and CLI flags from here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate.utils as kv
import yaml

from tests.paths import REPO_ROOT
from worker.cli import build_parser

DEPLOY = REPO_ROOT / "deploy"
K8S_DIR = DEPLOY / "kubernetes"

# The oldest Kubernetes minor these manifests promise to work on (docs/operations.md), and the newest
# one kubernetes-validate bundles.
K8S_MIN_VERSION = "1.30"
K8S_VERSIONS = [K8S_MIN_VERSION, ".".join(kv.latest_version().split(".")[:2])]

YAMLLINT_CONFIG = """
extends: default
rules:
  line-length: {max: 110}
"""

# Environment variables of the worker containers that are not DERENDER_ flags (anything else is a typo).
NON_FLAG_ENV = {
    "KAFKA_BOOTSTRAP_SERVERS",  # the documented fallback of --bootstrap-servers
    "POD_NAME",  # the documented default of --group-instance-id
    "PATH",
    "HOME",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "HF_HUB_OFFLINE",
}


# ---- loading --------------------------------------------------------------------------------------


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in k8s_files():
        for doc in yaml_docs(path):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in objects, f"{key} defined twice"
            objects[key] = doc
    return objects


# ---- the worker's CLI -------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_parser(*path: str) -> argparse.ArgumentParser | None:
    parser: argparse.ArgumentParser | None = build_parser()
    for name in path:
        parser = subcommands(parser).get(name) if parser else None
    return parser


def flag_env_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """``--x-y`` -> ``DERENDER_X_Y`` for every long option of ``parser``."""
    names: dict[str, argparse.Action] = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                names["DERENDER_" + option[2:].replace("-", "_").upper()] = action
    return names


# ---- KEDA ------------------------------------------------------------------------------------------


def keda_validator(kind: str) -> jsonschema.protocols.Validator:
    name = {"ScaledObject": "keda-scaledobject", "TriggerAuthentication": "keda-triggerauthentication"}[kind]
    schema = json.loads((K8S_DIR / "schemas" / f"{name}.schema.json").read_text(encoding="utf-8"))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator: jsonschema.protocols.Validator = validator_class(
        schema, format_checker=validator_class.FORMAT_CHECKER
    )
    return validator


def schema_errors(kind: str, doc: dict[str, Any]) -> list[str]:
    return [f"{list(e.path)}: {e.message}" for e in keda_validator(kind).iter_errors(doc)]
