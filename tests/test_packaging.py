"""The wheel an operator installs: what it holds, and that its demo runs without the source tree.

The wheel is built offline by the build backend the dev install has (``setuptools``) from a copy
of what the container image builds from, installed with ``--no-deps`` into a fresh venv that
borrows this venv's dependencies, and run from a directory outside the source tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT
from worker import demo_setup

# What the Dockerfile copies to build the package: the package needs nothing else.
BUILD_INPUTS = ("pyproject.toml", "README.md", "worker", "schemas")
DEMO_SAMPLES = (
    "worker/demo_samples/NOTICE.md",
    "worker/demo_samples/models/qwen3/config.json",
    "worker/demo_samples/models/qwen3/generation_config.json",
    "worker/demo_samples/models/qwen3/tokenizer.json.xz",
    "worker/demo_samples/models/qwen3/tokenizer_config.json",
    "worker/demo_samples/streams/demo-qwen3.jsonl",
)


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("dist")
    # The build backend's PEP 517 hook, as `pip wheel --no-deps --no-build-isolation` calls it,
    # without pip's own start-up (half of the time on a loaded machine).
    build = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    built = _run([sys.executable, "-c", build], source)
    assert built.returncode == 0, built.stdout + built.stderr
    return out / built.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel; its dependencies are this venv's (a path entry after its own)."""
    venv = tmp_path_factory.mktemp("venv")
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python)]
    done = _run([*pip, "install", "--no-deps", "--no-index", "-q", str(wheel)], venv)
    assert done.returncode == 0, done.stdout + done.stderr
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], venv)
    # Lines of a .pth file only extend the path: this venv's own .pth files (among them the editable
    # install's, which points at the source tree) are not run.
    (Path(site.stdout.strip()) / "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _outside_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", *demo_setup.BOOTSTRAP_ENVS}}
    return env | {"XDG_CACHE_HOME": str(home / "cache"), "HF_HUB_OFFLINE": "1"}


def test_the_wheel_holds_the_demo_samples_and_no_test_double(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert set(DEMO_SAMPLES) <= set(names)
    assert not [n for n in names if "fake_vllm" in n]
    roots = {n.split("/")[0] for n in names}
    assert {r for r in roots if not r.endswith(".dist-info")} == {"worker", "schemas"}
    packaged = zipfile.ZipFile(wheel).read("worker/demo_samples/streams/demo-qwen3.jsonl")
    assert packaged == (REPO_ROOT / "samples" / "streams" / "demo-qwen3.jsonl").read_bytes()


def test_the_installed_demo_runs_outside_the_source_tree(installed: Path, tmp_path: Path) -> None:
    env = _outside_env(tmp_path)
    where = _run(
        [str(installed / "bin" / "python"), "-c", "import worker; print(worker.__file__)"], tmp_path, env
    )
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stdout + where.stderr

    done = _run([str(installed / "bin" / "derender-worker"), "demo", "--offline"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("derendering demo-qwen3.jsonl with the tokenizer in qwen3/")
    assert "assembled responses:" in done.stdout
    assert "北京你好" in done.stdout  # the emoji/CJK answer, decoded by the packaged tokenizer
    assert "get_weather" in done.stdout


def test_the_installed_demo_without_a_broker_says_how_to_get_one(installed: Path, tmp_path: Path) -> None:
    env = _outside_env(tmp_path)
    done = _run([str(installed / "bin" / "derender-worker"), "demo"], tmp_path, env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "KAFKA_BOOTSTRAP_SERVERS" in done.stderr and "--offline" in done.stderr
    assert "deploy/local/kafka start" in done.stderr

    piped = _run([str(installed / "bin" / "derender-worker"), "demo", "--pipeline"], tmp_path, env)
    assert piped.returncode == 1, piped.stdout + piped.stderr
    assert "clone of the repository" in piped.stderr and "./run demo --pipeline" in piped.stderr
