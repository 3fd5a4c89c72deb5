"""Kafka security flags -> aiokafka client kwargs, with real PEM files made by the openssl CLI."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest

from worker.errors import ConfigurationError
from worker.runtime.security.from_settings import kafka_security
from worker.runtime.security.kafka_security import KafkaSecurity, SaslMechanism, Secret, SecurityProtocol
from worker.settings import (
    SecuritySettings,
    add_arguments,
    load,
)

PASSWORD = "hunter2-s3cr3t"
ENV_NAMES = [
    "DERENDER_SECURITY_PROTOCOL",
    "DERENDER_SASL_MECHANISM",
    "DERENDER_SASL_USERNAME",
    "DERENDER_SASL_PASSWORD",
    "DERENDER_SSL_CAFILE",
    "DERENDER_SSL_CERTFILE",
    "DERENDER_SSL_KEYFILE",
    "DERENDER_SSL_KEY_PASSWORD",
    "DERENDER_SSL_CHECK_HOSTNAME",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, SecuritySettings)
    return parser.parse_args(list(argv))


def _security(*argv: str) -> KafkaSecurity:
    return kafka_security(load(SecuritySettings, _parse(*argv)))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a client certificate it signed, the client's key (plain and encrypted)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found")
    d = tmp_path_factory.mktemp("pki")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=derender-test-ca")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
        "-subj", "/CN=derender-worker")  # fmt: skip
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "client.crt", "-days", "2")  # fmt: skip
    run("pkey", "-in", "client.key", "-aes256", "-passout", "pass:keypass", "-out", "client.enc.key")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.csr",
        "-subj", "/CN=other")  # fmt: skip
    (d / "garbage.pem").write_text("not a certificate\n")
    return {name: d / name for name in ("ca.crt", "client.crt", "client.key", "client.enc.key", "other.key",
                                         "garbage.pem")}  # fmt: skip


def test_default_is_plaintext() -> None:
    security = _security()
    assert security.protocol is SecurityProtocol.PLAINTEXT
    assert security.client_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert security.ssl_context() is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "scram_sha_512"])
def test_sasl_plaintext_kwargs(mechanism: str) -> None:
    security = _security(
        "--security-protocol", "sasl_plaintext", "--sasl-mechanism", mechanism,
        "--sasl-username", "alice", "--sasl-password", PASSWORD,
    )  # fmt: skip
    assert security.client_kwargs() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": SaslMechanism(mechanism.upper().replace("_", "-")).value,
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
    }


def test_kwargs_reach_every_aiokafka_client(pki: dict[str, Path]) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient

    kwargs = _security(
        "--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "alice",
        "--sasl-password", PASSWORD, "--ssl-cafile", str(pki["ca.crt"]),
    ).client_kwargs()  # fmt: skip

    # Constructing (not starting) runs aiokafka's own validation of the settings.
    async def construct() -> list[Any]:  # aiokafka's clients want a running loop
        admin = AIOKafkaAdminClient(bootstrap_servers="127.0.0.1:1", **kwargs)
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", **kwargs)
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", **kwargs)
        await producer.stop()
        # A keyword aiokafka does not know is refused, not ignored: the names above were checked.
        with pytest.raises(TypeError, match="sasl_plain_passwrd"):
            AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", sasl_plain_passwrd=PASSWORD)
        return [admin._client, consumer._client, producer.client]

    # Each client's connections use these settings (aiokafka keeps them on its AIOKafkaClient).
    for client in asyncio.run(construct()):
        assert client._security_protocol == "SASL_SSL"
        assert client._sasl_mechanism == "SCRAM-SHA-512"
        assert (client._sasl_plain_username, client._sasl_plain_password) == ("alice", PASSWORD)
        assert client._ssl_context is kwargs["ssl_context"]


def test_ssl_context_loads_the_ca_and_verifies(pki: dict[str, Path]) -> None:
    security = _security("--security-protocol", "SSL", "--ssl-cafile", str(pki["ca.crt"]))
    kwargs = security.client_kwargs()
    assert set(kwargs) == {"security_protocol", "ssl_context"}
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname is True
    subjects = [cert["subject"] for cert in context.get_ca_certs()]
    assert subjects == [((("commonName", "derender-test-ca"),),)]


def test_mutual_tls_and_no_hostname_check(pki: dict[str, Path]) -> None:
    security = _security(
        "--security-protocol", "SASL_SSL", "--sasl-mechanism", "PLAIN", "--sasl-username", "u",
        "--sasl-password", PASSWORD, "--ssl-cafile", str(pki["ca.crt"]), "--ssl-certfile",
        str(pki["client.crt"]), "--ssl-keyfile", str(pki["client.key"]), "--no-ssl-check-hostname",
    )  # fmt: skip
    kwargs = security.client_kwargs()
    context = kwargs["ssl_context"]
    assert context.check_hostname is False
    assert context.verify_mode is ssl.CERT_REQUIRED  # the chain is still verified
    assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["sasl_plain_password"] == PASSWORD


def test_encrypted_key_with_password(pki: dict[str, Path]) -> None:
    base = ["--security-protocol", "SSL", "--ssl-cafile", str(pki["ca.crt"]), "--ssl-certfile",
            str(pki["client.crt"]), "--ssl-keyfile", str(pki["client.enc.key"])]  # fmt: skip
    assert isinstance(_security(*base, "--ssl-key-password", "keypass").ssl_context(), ssl.SSLContext)
    with pytest.raises(ConfigurationError, match="TLS context"):
        _security(*base, "--ssl-key-password", "wrong").ssl_context()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--security-protocol", "SASL_SSL", "--sasl-username", "u", "--sasl-password", "p"],
         "--sasl-mechanism"),
        (["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN"], "--sasl-username"),
        (["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN", "--sasl-username", "u"],
         "--sasl-password"),
        (["--sasl-mechanism", "PLAIN"], "use SASL_PLAINTEXT or SASL_SSL"),
        (["--security-protocol", "SSL", "--sasl-username", "u"], "use SASL_PLAINTEXT or SASL_SSL"),
        (["--ssl-cafile", "/etc/hostname"], "use SSL or SASL_SSL"),
        (["--security-protocol", "SSL", "--ssl-cafile", "/no/such/ca.pem"], "no such file"),
        (["--security-protocol", "SSL", "--ssl-keyfile", "/etc/hostname"], "needs --ssl-certfile"),
    ],
)  # fmt: skip
def test_invalid_combinations(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _security(*argv)


def test_bad_pem_files_are_configuration_errors(pki: dict[str, Path]) -> None:
    garbage = _security("--security-protocol", "SSL", "--ssl-cafile", str(pki["garbage.pem"]))
    with pytest.raises(ConfigurationError, match="TLS context"):
        garbage.client_kwargs()
    mismatched = _security(
        "--security-protocol", "SSL", "--ssl-certfile", str(pki["client.crt"]), "--ssl-keyfile",
        str(pki["other.key"]),
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="TLS context"):
        mismatched.client_kwargs()


def test_unknown_protocol_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL")):
        _security("--security-protocol", "TLS")


def test_environment(monkeypatch: pytest.MonkeyPatch, pki: dict[str, Path]) -> None:
    monkeypatch.setenv("DERENDER_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("DERENDER_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("DERENDER_SASL_USERNAME", "bob")
    monkeypatch.setenv("DERENDER_SASL_PASSWORD", PASSWORD)
    monkeypatch.setenv("DERENDER_SSL_CAFILE", str(pki["ca.crt"]))
    monkeypatch.setenv("DERENDER_SSL_CHECK_HOSTNAME", "false")
    security = _security()
    assert security.protocol is SecurityProtocol.SASL_SSL
    assert security.sasl_mechanism is SaslMechanism.SCRAM_SHA_256
    assert security.ssl_cafile == str(pki["ca.crt"]) and security.ssl_check_hostname is False
    assert security.client_kwargs()["sasl_plain_password"] == PASSWORD
    # The command line wins over the environment.
    for name in ENV_NAMES[1:]:
        monkeypatch.delenv(name, raising=False)
    assert _security("--security-protocol", "PLAINTEXT").protocol is SecurityProtocol.PLAINTEXT

    monkeypatch.setenv("DERENDER_SECURITY_PROTOCOL", "KERBEROS")
    with pytest.raises(ConfigurationError, match="DERENDER_SECURITY_PROTOCOL"):
        _security()


def test_password_never_shows(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DERENDER_SASL_PASSWORD", PASSWORD)
    args = _parse("--security-protocol", "SASL_SSL", "--sasl-mechanism", "PLAIN", "--sasl-username", "u")
    security = kafka_security(load(SecuritySettings, args))
    from_flag = _parse("--sasl-password", PASSWORD)
    caplog.set_level(logging.DEBUG)
    logging.getLogger("test").info("settings %s %r %s %s", args, security, security.describe(), from_flag)
    for text in (
        repr(args),
        repr(from_flag),
        repr(security),
        str(security),
        security.describe(),
        caplog.text,
    ):
        assert PASSWORD not in text
    assert "Secret('********')" in repr(from_flag)
    assert Secret(PASSWORD).reveal() == PASSWORD and Secret("a") == Secret("a")
