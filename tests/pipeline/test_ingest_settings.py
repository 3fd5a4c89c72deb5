"""ingest's Kafka settings: the client library flag it shares with run, and its transactional ids."""

from __future__ import annotations

import pytest

from worker.cli import build_parser
from worker.errors import ConfigurationError
from worker.runtime.kafka_client.base import ClientKind
from worker.settings import IngestOptions, load


def _ingest(argv: list[str]) -> IngestOptions:
    return load(IngestOptions, build_parser().parse_args(["ingest", "--bootstrap-servers", "b:1", *argv]))


def test_kafka_client_is_run_s_flag_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DERENDER_KAFKA_CLIENT", raising=False)
    assert _ingest([]).kafka_client is ClientKind.CONFLUENT
    assert _ingest(["--kafka-client", "aiokafka"]).kafka_client is ClientKind.AIOKAFKA
    monkeypatch.setenv("DERENDER_KAFKA_CLIENT", "aiokafka")
    assert _ingest([]).kafka_client is ClientKind.AIOKAFKA
    with pytest.raises(ConfigurationError, match="--kafka-client"):
        _ingest(["--kafka-client", "kafka-python"])


def test_a_requests_partition_s_transactional_id_is_stable_and_its_own() -> None:
    settings = _ingest(["--group-id", "g", "--requests-topic", "req", "--input-topic", "in"])
    # The next owner of partition 2 uses the same id, which is what fences a zombie.
    assert (
        settings.transactional_id(2)
        == "g-req-2"
        == _ingest(["--group-id", "g", "--requests-topic", "req"]).transactional_id(2)
    )
    assert settings.transactional_id(2) != settings.transactional_id(3)
