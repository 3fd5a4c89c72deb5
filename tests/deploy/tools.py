"""The command-line tools the deployment tests run, found where ``./run tests`` puts them.

``./run tests`` installs each one that is missing (helm, kustomize and docker-compose built with
``go install`` into ``$(go env GOPATH)/bin``), so a missing tool is a broken setup: the test
fails and says how to get it, never skips (CI must not go green with the deploy files unchecked).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# What ./run tests installs when the tool is missing (tests/deploy/test_tools.py checks ./run names them).
HELM_MODULE = "helm.sh/helm/v4/cmd/helm@v4.3.2"
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5@v5.8.1"
COMPOSE_MODULE = "github.com/docker/compose/v5/cmd@v5.6.0"


@functools.cache
def _go_bin() -> list[Path]:
    directories = []
    go = shutil.which("go")
    if go is not None:
        result = subprocess.run(
            [go, "env", "GOPATH"], capture_output=True, text=True, timeout=60, check=False
        )
        directories += [Path(p, "bin") for p in result.stdout.strip().split(os.pathsep) if p]
    directories.append(Path.home() / "go" / "bin")
    return directories


def find(name: str) -> str | None:
    """``name`` on PATH, beside the interpreter (the venv) or in Go's bin directory."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    for directory in _go_bin():
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _missing(name: str, module: str) -> str:
    return (
        f"{name} is missing: `./run tests` builds it with Go ({module}); "
        "without Go, install it on PATH. The deployment files are not checked without it."
    )


def helm() -> str:
    found = find("helm")
    if found is None:
        pytest.fail(_missing("helm", HELM_MODULE))
    return found


def kustomize() -> list[str]:
    """The command that renders a kustomization directory given as its last argument."""
    kubectl = find("kubectl")
    if kubectl is not None:
        return [kubectl, "kustomize"]
    standalone = find("kustomize")
    if standalone is not None:
        return [standalone, "build"]
    pytest.fail(_missing("kustomize (or kubectl)", KUSTOMIZE_MODULE))


@functools.cache
def _docker_has_compose(docker: str) -> bool:
    probe = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
    )
    return probe.returncode == 0


def compose() -> list[str]:
    """``docker compose`` (the plugin) or the standalone ``docker-compose`` v2+ binary."""
    docker = find("docker")
    if docker is not None and _docker_has_compose(docker):
        return [docker, "compose"]
    standalone = find("docker-compose")
    if standalone is not None:
        return [standalone]
    pytest.fail(_missing("docker compose (plugin or docker-compose)", COMPOSE_MODULE))
