"""Only the client layer (``worker/runtime/kafka_client/``) imports a Kafka client library, so that
``--kafka-client`` decides which library serves a command, and a library's types and errors stay
behind the layer's protocols (docs/kafka-worker.md, "The Kafka client layer")."""

from __future__ import annotations

import ast

from tests.paths import REPO_ROOT

LIBRARIES = ("aiokafka", "confluent_kafka")
CLIENT_LAYER = "worker/runtime/kafka_client/"

# Files that still import a client library themselves, each with why; remove a line once its file
# goes through the layer (a line whose file no longer imports one fails below).
ALLOWED = {
    # The TLS context and OAUTHBEARER token providers aiokafka's clients are built with; they move
    # once the layer maps KafkaSecurity for aiokafka itself, as it does for librdkafka.
    "worker/runtime/security/kafka_security.py",
    "worker/runtime/security/kafka_oauth.py",
}


def library_imports(source: str) -> list[str]:
    """The client-library modules ``source`` imports, at any depth (also inside functions)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [name for name in names if name.split(".")[0] in LIBRARIES]
    return found


def _importers() -> dict[str, list[str]]:
    out = {}
    for path in sorted((REPO_ROOT / "worker").rglob("*.py")):
        relative = path.relative_to(REPO_ROOT).as_posix()
        if relative.startswith(CLIENT_LAYER):
            continue
        imported = library_imports(path.read_text("utf-8"))
        if imported:
            out[relative] = imported
    return out


def test_only_the_client_layer_imports_a_kafka_client_library() -> None:
    importers = _importers()
    assert {path: names for path, names in importers.items() if path not in ALLOWED} == {}
    # An allowance outlives its reason once its file stops importing: it must go then.
    assert sorted(ALLOWED - set(importers)) == []


def test_every_kind_of_import_is_seen() -> None:
    source = (
        "import aiokafka\n"
        "import json, confluent_kafka.admin as admin\n"
        "from aiokafka.errors import KafkaError\n"
        "from .aiokafka import x\n"  # a relative module of that name is the project's own
        "import aiokafkax\n"
        "def f():\n"
        "    from confluent_kafka import Consumer\n"
    )
    assert library_imports(source) == [
        "aiokafka",
        "confluent_kafka.admin",
        "aiokafka.errors",
        "confluent_kafka",
    ]


def test_the_client_layer_is_where_the_libraries_are_imported() -> None:
    layer = REPO_ROOT / CLIENT_LAYER
    imported = {
        name.split(".")[0] for p in layer.glob("*.py") for name in library_imports(p.read_text("utf-8"))
    }
    assert imported == set(LIBRARIES)
