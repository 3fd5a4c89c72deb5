"""docs/configuration.md lists every flag of every command, so that its table stays the one place to
look a setting up. A flag added to a command fails here until it has a row there."""

from __future__ import annotations

import argparse
import re

import yaml

from tests.paths import REPO_ROOT
from worker.cli import build_parser

CONFIGURATION = REPO_ROOT / "docs" / "configuration.md"
CHART = REPO_ROOT / "deploy" / "helm" / "derender-worker"


def _flags(parser: argparse.ArgumentParser, command: str = "") -> dict[str, set[str]]:
    """Every long option of every (sub-)command, by command name (``topics create``, ...)."""
    found: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_flags(sub, f"{command} {name}".strip()))
        elif command and action.option_strings and not isinstance(action, argparse._HelpAction):
            found.setdefault(command, set()).update(o for o in action.option_strings if o.startswith("--"))
    return found


def test_every_flag_of_every_command_is_in_the_configuration_table() -> None:
    text = CONFIGURATION.read_text("utf-8")
    flags = _flags(build_parser())
    assert {"run", "replay", "topics create", "dlq replay", "audit", "ingest", "gateway"} <= set(flags)
    missing = {command: sorted(f for f in names if f"`{f}`" not in text) for command, names in flags.items()}
    assert {command: names for command, names in missing.items() if names} == {}


def test_the_commit_interval_how_to_names_settings_that_exist() -> None:
    """The how-to's flag, variable, manifest key and Helm value are the real ones."""
    text = CONFIGURATION.read_text("utf-8")
    assert "--commit-interval-ms" in _flags(build_parser())["run"]
    assert "`DERENDER_COMMIT_INTERVAL_MS=50 derender-worker run ...`" in text
    configmap = yaml.safe_load((REPO_ROOT / "deploy" / "kubernetes" / "configmap.yaml").read_text("utf-8"))
    assert "DERENDER_COMMIT_INTERVAL_MS" in configmap["data"]
    helm_value = re.search(r"--set (processing\.\w+)=50", text)
    assert helm_value is not None
    values = yaml.safe_load((CHART / "values.yaml").read_text("utf-8"))
    section, key = helm_value.group(1).split(".")
    assert key in values[section]
    chart_configmap = (CHART / "templates" / "configmap.yaml").read_text("utf-8")
    assert f"DERENDER_COMMIT_INTERVAL_MS: {{{{ $v.{section}.{key} | quote }}}}" in chart_configmap
