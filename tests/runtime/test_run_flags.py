"""The run command's Kafka flags: defaults, environment variables, and bad values as configuration errors."""

from __future__ import annotations

import pytest

from worker.cli import build_parser
from worker.errors import ConfigurationError
from worker.runtime.security.from_settings import load_kafka
from worker.settings import DeliveryMode, KafkaSettings


def _settings(argv: list[str]) -> KafkaSettings:
    args = build_parser().parse_args(["run", "--tokenizer", "x", *argv])
    return load_kafka(KafkaSettings, args)


def test_state_checkpoint_interval_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DERENDER_BOOTSTRAP_SERVERS", "b:9092")
    monkeypatch.delenv("DERENDER_STATE_CHECKPOINT_INTERVAL_MS", raising=False)
    assert _settings([]).state_checkpoint_interval_ms == 10_000
    assert _settings(["--state-checkpoint-interval-ms", "0"]).state_checkpoint_interval_ms == 0
    with pytest.raises(ConfigurationError, match="--state-checkpoint-interval-ms"):
        _settings(["--state-checkpoint-interval-ms", "-1"])


def test_flags_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DERENDER_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "fallback:9092")
    monkeypatch.setenv("DERENDER_GROUP_ID", "g-env")
    monkeypatch.setenv("DERENDER_MODE", "at-least-once")
    monkeypatch.setenv("DERENDER_COMMIT_INTERVAL_MS", "250")
    monkeypatch.setenv("DERENDER_INPUT_TOPIC", "in-env")
    settings = _settings([])
    assert settings.bootstrap_servers == "fallback:9092"
    assert settings.group_id == "g-env"
    assert settings.mode is DeliveryMode.AT_LEAST_ONCE
    assert settings.commit_interval_ms == 250
    assert settings.topics.input == "in-env"
    assert settings.transactional_id(3) == "g-env-in-env-3"

    monkeypatch.setenv("DERENDER_BOOTSTRAP_SERVERS", "primary:9092")
    assert _settings([]).bootstrap_servers == "primary:9092"
    assert _settings(["--bootstrap-servers", "flag:9092"]).bootstrap_servers == "flag:9092"


def test_bad_settings_are_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DERENDER_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(ConfigurationError, match="bootstrap-servers"):
        _settings([])
    with pytest.raises(ConfigurationError, match="distinct"):
        _settings(["--bootstrap-servers", "b:1", "--output-topic", "derender-requests"])
    with pytest.raises(ConfigurationError, match="commit-interval-ms"):
        _settings(["--bootstrap-servers", "b:1", "--commit-interval-ms", "0"])
    monkeypatch.setenv("DERENDER_COMMIT_INTERVAL_MS", "soon")
    with pytest.raises(ConfigurationError, match="DERENDER_COMMIT_INTERVAL_MS"):
        _settings(["--bootstrap-servers", "b:1"])
