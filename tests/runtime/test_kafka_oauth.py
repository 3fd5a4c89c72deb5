"""SASL/OAUTHBEARER with OIDC client credentials, against a real broker, and the AWS MSK IAM signer.

The test starts its own second broker (``deploy/local/kafka`` with its own ``KAFKA_HOME_DIR``, free
ports and ``KAFKA_EXTRA_CONFIG``) with a SASL_PLAINTEXT listener for OAUTHBEARER, validated by
Kafka's unsecured-JWT validator (which requires the scope ``kafka``), plus a PLAINTEXT listener the
test itself uses. A local token endpoint issues unsecured JWTs by the client credentials grant.
``topics create``, ``run`` and ``dlq replay`` then authenticate with nothing but their flags.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from tests.kafka_broker import second_broker_home
from tests.kafka_helpers import QWEN3_CONFIG, TopicReader, free_port, generate_sequences, model_args
from tests.paths import REPO_ROOT
from worker.errors import ConfigurationError, TokenError
from worker.runtime.kafka_client import confluent_backend
from worker.runtime.security.from_settings import kafka_security
from worker.runtime.security.kafka_oauth import MskIamTokenProvider, OidcClientCredentials, OidcTokenProvider
from worker.runtime.security.kafka_security import KafkaSecurity, SaslMechanism, Secret, SecurityProtocol
from worker.settings import (
    SecuritySettings,
    add_arguments,
    load,
)

KAFKA_SCRIPT = REPO_ROOT / "deploy" / "local" / "kafka"
CLIENT_ID = "derender"
CLIENT_SECRET = "s3cret:with/odd&chars"
SCOPE = "kafka"


# --- a local OIDC token endpoint -------------------------------------------------------------------


def unsecured_jwt(subject: str, scope: str, lifetime_s: int) -> str:
    """An ``alg: none`` JWT as Kafka's unsecured validator accepts it."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {"sub": subject, "iat": now, "exp": now + lifetime_s, "scope": scope}
    return f"{part({'alg': 'none'})}.{part(claims)}."


@dataclass
class TokenEndpoint:
    lifetime_s: int = 3600
    requests: list[dict[str, str]] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/token"

    def start(self) -> TokenEndpoint:
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                endpoint.requests.append(form)
                pair = (
                    f"{urllib.parse.quote(CLIENT_ID, safe='')}:{urllib.parse.quote(CLIENT_SECRET, safe='')}"
                )
                expected = base64.b64encode(pair.encode()).decode()
                if self.headers.get("Authorization") != f"Basic {expected}":
                    self._answer(401, {"error": "invalid_client"})
                elif form.get("grant_type") != "client_credentials":
                    self._answer(400, {"error": "unsupported_grant_type"})
                else:
                    token = unsecured_jwt(CLIENT_ID, form.get("scope", ""), endpoint.lifetime_s)
                    self._answer(
                        200,
                        {"access_token": token, "token_type": "Bearer", "expires_in": endpoint.lifetime_s},
                    )

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def token_endpoint() -> Iterator[TokenEndpoint]:
    endpoint = TokenEndpoint().start()
    yield endpoint
    endpoint.stop()


def _credentials(endpoint: TokenEndpoint, secret: str = CLIENT_SECRET) -> OidcClientCredentials:
    return OidcClientCredentials(endpoint.url, CLIENT_ID, Secret(secret), SCOPE)


# --- the provider ----------------------------------------------------------------------------------


def test_token_is_cached_and_refreshed_before_it_expires(token_endpoint: TokenEndpoint) -> None:
    token_endpoint.lifetime_s = 100
    now = [1_000.0]
    provider = OidcTokenProvider(_credentials(token_endpoint), clock=lambda: now[0])

    async def body() -> None:
        first = await provider.token()
        assert await provider.token() == first and provider.fetches == 1
        now[0] += 79  # 21 s left of 100: more than the 20% margin, still cached
        assert await provider.token() == first and provider.fetches == 1
        now[0] += 2  # 19 s left: refreshed before it expires
        await provider.token()
        assert provider.fetches == 2
        # Concurrent connections share one fetch.
        now[0] += 100
        await asyncio.gather(*(provider.token() for _ in range(5)))
        assert provider.fetches == 3

    asyncio.run(body())
    assert token_endpoint.requests[0] == {"grant_type": "client_credentials", "scope": SCOPE}
    assert len(token_endpoint.requests) == 3


def test_librdkafka_fetches_through_the_same_provider(token_endpoint: TokenEndpoint) -> None:
    # The secret has ':', '/' and '&': the endpoint checks RFC 6749's form-encoded Basic credentials,
    # which librdkafka's own OIDC grant does not send.
    security = KafkaSecurity(
        protocol=SecurityProtocol.SASL_PLAINTEXT,
        sasl_mechanism=SaslMechanism.OAUTHBEARER,
        oauth=_credentials(token_endpoint),
    )
    token, expires_at = confluent_backend.security_config(security)["oauth_cb"]("")
    assert token.count(".") == 2 and expires_at > time.time() + 3000
    assert token_endpoint.requests == [{"grant_type": "client_credentials", "scope": SCOPE}]


def test_token_endpoint_failures_are_token_errors(token_endpoint: TokenEndpoint) -> None:
    with pytest.raises(TokenError, match="HTTP 401"):
        asyncio.run(OidcTokenProvider(_credentials(token_endpoint, secret="wrong")).token())
    unreachable = OidcClientCredentials(f"http://127.0.0.1:{free_port()}/t", CLIENT_ID, Secret("x"), None)
    with pytest.raises(TokenError, match="unreachable"):
        asyncio.run(OidcTokenProvider(unreachable).token())


class _Redirector(http.server.BaseHTTPRequestHandler):
    """Answers every POST with a 307 to ``target`` (307 keeps the method, body and, in a naive
    client, the Authorization header)."""

    target: ClassVar[str] = ""
    seen: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        type(self).seen.append(self.headers.get("Authorization", ""))
        self.send_response(307)
        self.send_header("Location", type(self).target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_redirect_is_an_error_and_the_credentials_go_nowhere_else(token_endpoint: TokenEndpoint) -> None:
    # The redirect points at another origin (another port) that would issue a token: a client that
    # follows it sends the Basic credentials there.
    handler: type[_Redirector] = type(
        "Redirector", (_Redirector,), {"target": token_endpoint.url, "seen": []}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/token"
        provider = OidcTokenProvider(OidcClientCredentials(url, CLIENT_ID, Secret(CLIENT_SECRET), SCOPE))
        with pytest.raises(TokenError, match="HTTP 307, a redirect: not followed"):
            asyncio.run(provider.token())
        with pytest.raises(TokenError, match="redirect"):
            provider.fetch()  # librdkafka's path too
    finally:
        server.shutdown()
        server.server_close()
    assert len(handler.seen) == 2
    assert token_endpoint.requests == []


@pytest.mark.parametrize(
    "endpoint",
    ["https://idp.example/token", "http://127.0.0.1:8080/t", "http://127.3.2.1/t", "http://localhost/t",
     "http://[::1]:9/t"],
)  # fmt: skip
def test_https_or_loopback_endpoints_are_accepted(endpoint: str) -> None:
    OidcClientCredentials(endpoint, CLIENT_ID, Secret("x"), None).validate()


@pytest.mark.parametrize(
    "endpoint",
    ["http://idp.example/token", "http://10.0.0.1/t", "http://[2001:db8::1]/t", "http://localhost.evil/t",
     "ftp://idp/t", "https:///t", "idp.example/token"],
)  # fmt: skip
def test_plain_http_elsewhere_is_refused(endpoint: str) -> None:
    credentials = OidcClientCredentials(endpoint, CLIENT_ID, Secret("x"), None)
    with pytest.raises(ConfigurationError, match="https"):
        credentials.validate()
    with pytest.raises(ConfigurationError, match="https"):
        OidcTokenProvider(credentials)  # built by hand: refused all the same


def test_oauthbearer_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    for name in list(os.environ):
        if name.startswith("DERENDER_") or name == "AWS_REGION":
            monkeypatch.delenv(name)

    def security(*argv: str) -> KafkaSecurity:
        parser = argparse.ArgumentParser()
        add_arguments(parser, SecuritySettings)
        return kafka_security(load(SecuritySettings, parser.parse_args(list(argv))))

    base = ["--security-protocol", "SASL_SSL", "--sasl-mechanism", "OAUTHBEARER"]
    monkeypatch.setenv("DERENDER_SASL_OAUTH_CLIENT_SECRET", CLIENT_SECRET)
    good = security(*base, "--sasl-oauth-token-endpoint", "https://idp/token", "--sasl-oauth-client-id", "c")
    assert good.sasl_mechanism is SaslMechanism.OAUTHBEARER
    kwargs = good.client_kwargs()
    assert kwargs["sasl_mechanism"] == "OAUTHBEARER"
    assert isinstance(kwargs["sasl_oauth_token_provider"], OidcTokenProvider)
    assert CLIENT_SECRET not in repr(good) and CLIENT_SECRET not in good.describe()
    for argv, message in [
        (base, "needs --sasl-oauth-token-endpoint"),
        ([*base, "--sasl-oauth-token-endpoint", "ftp://idp", "--sasl-oauth-client-id", "c"], "http"),
        ([*base, "--sasl-oauth-token-endpoint", "https://idp/t"], "client-id"),
        (
            [
                *base,
                "--sasl-oauth-token-endpoint",
                "https://idp/t",
                "--sasl-oauth-client-id",
                "c",
                "--sasl-username",
                "u",
            ],
            "uses no password",
        ),
        (["--sasl-oauth-token-endpoint", "https://idp/t"], "SASL_PLAINTEXT or SASL_SSL"),
        (["--security-protocol", "SASL_SSL", "--sasl-mechanism", "AWS_MSK_IAM"], "--sasl-oauth-"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            security(*argv)
    monkeypatch.delenv("DERENDER_SASL_OAUTH_CLIENT_SECRET")
    with pytest.raises(ConfigurationError, match="--aws-region"):
        security("--security-protocol", "SASL_SSL", "--sasl-mechanism", "AWS_MSK_IAM")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    msk = security("--security-protocol", "SASL_SSL", "--sasl-mechanism", "aws_msk_iam")
    assert msk.aws_region == "eu-west-1" and msk.protocol is SecurityProtocol.SASL_SSL
    provider = msk.client_kwargs()["sasl_oauth_token_provider"]
    assert isinstance(provider, MskIamTokenProvider) and provider.region == "eu-west-1"


def test_msk_iam_token_is_signed_from_the_aws_credential_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signer runs for real (no network: it presigns locally with the given credentials)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEY123456")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    provider = MskIamTokenProvider("eu-west-1")

    async def body() -> tuple[str, str]:
        return await provider.token(), await provider.token()

    first, second = asyncio.run(body())
    assert first == second and provider.fetches == 1
    url = base64.urlsafe_b64decode(first + "=" * (-len(first) % 4)).decode()
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert url.startswith("https://kafka.eu-west-1.amazonaws.com/")
    assert query["Action"] == "kafka-cluster:Connect"
    assert query["X-Amz-Credential"].startswith("AKIAEXAMPLEKEY123456/")
    assert "/eu-west-1/kafka-cluster/" in query["X-Amz-Credential"]


# --- against a broker with an OAUTHBEARER listener -------------------------------------------------


@dataclass
class OAuthBroker:
    plaintext: str
    sasl: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def oauth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthBroker]:
    home = second_broker_home(tmp_path_factory.mktemp("kafka-oauth"))
    port, controller, sasl = free_port(), free_port(), free_port()
    extra = "\n".join(
        [
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller},"
            f"SASL_PLAINTEXT://127.0.0.1:{sasl}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms=OAUTHBEARER",
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config="
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            f'unsecuredLoginStringClaim_sub="broker" unsecuredValidatorRequiredScope="{SCOPE}";',
        ]
    )
    env = {
        **os.environ,
        "KAFKA_HOME_DIR": str(home),
        "KAFKA_PORT": str(port),
        "KAFKA_CONTROLLER_PORT": str(controller),
        "KAFKA_EXTRA_CONFIG": extra,
        "KAFKA_HEAP_OPTS": "-Xms128m -Xmx512m",
        "KAFKA_START_TIMEOUT": "180",
    }
    started = subprocess.run(
        [str(KAFKA_SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=900
    )
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        yield OAuthBroker(f"127.0.0.1:{port}", f"127.0.0.1:{sasl}", env)
    finally:
        subprocess.run([str(KAFKA_SCRIPT), "stop"], env=env, capture_output=True, timeout=120)


def _cli_env(endpoint: TokenEndpoint, scope: str = SCOPE) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DERENDER_") and k != "KAFKA_BOOTSTRAP_SERVERS"
    }
    return env | {
        "PYTHONUNBUFFERED": "1",
        "DERENDER_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "DERENDER_SASL_MECHANISM": "OAUTHBEARER",
        "DERENDER_SASL_OAUTH_TOKEN_ENDPOINT": endpoint.url,
        "DERENDER_SASL_OAUTH_CLIENT_ID": CLIENT_ID,
        "DERENDER_SASL_OAUTH_CLIENT_SECRET": CLIENT_SECRET,
        "DERENDER_SASL_OAUTH_SCOPE": scope,
    }


def _cli(*argv: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *argv],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.kafka
def test_a_token_without_the_scope_is_refused(
    oauth_broker: OAuthBroker, token_endpoint: TokenEndpoint
) -> None:
    security = KafkaSecurity(
        SecurityProtocol.SASL_PLAINTEXT,
        SaslMechanism.OAUTHBEARER,
        oauth=OidcClientCredentials(token_endpoint.url, CLIENT_ID, Secret(CLIENT_SECRET), "other-scope"),
    )

    log = Path(oauth_broker.env["KAFKA_HOME_DIR"]) / "logs" / "server.log"
    failures_before = log.read_text(errors="replace").count("Failed authentication")

    async def body() -> None:
        # aiokafka does not surface the broker's SASL rejection at start; nothing works after it.
        producer = AIOKafkaProducer(
            bootstrap_servers=oauth_broker.sasl, request_timeout_ms=5000, **security.client_kwargs()
        )
        await producer.start()
        try:
            await producer.send_and_wait("derender-anything", b"x")
        finally:
            await producer.stop()

    with pytest.raises(KafkaError):
        asyncio.run(body())
    assert log.read_text(errors="replace").count("Failed authentication") > failures_before
    assert token_endpoint.requests and token_endpoint.requests[0]["scope"] == "other-scope"


@pytest.mark.kafka
def test_topics_run_and_dlq_replay_authenticate_with_oauthbearer(
    oauth_broker: OAuthBroker, token_endpoint: TokenEndpoint
) -> None:
    env = _cli_env(token_endpoint)
    suffix = os.urandom(4).hex()
    topics = {
        "--input-topic": f"oauth-in-{suffix}",
        "--output-topic": f"oauth-out-{suffix}",
        "--state-topic": f"oauth-state-{suffix}",
        "--dlq-topic": f"oauth-dlq-{suffix}",
    }
    topic_args = [a for pair in topics.items() for a in pair]
    connect = ["--bootstrap-servers", oauth_broker.sasl]
    # `topics create` makes the pipeline's requests topic too: a name of its own, not the default's.
    requests = ["--requests-topic", f"oauth-req-{suffix}"]
    created = _cli("topics", "create", "--partitions", "2", *connect, *topic_args, *requests, env=env)
    assert created.returncode == 0, created.stderr
    assert created.stdout.count("created ") == 5
    fetched = len(token_endpoint.requests)
    assert fetched >= 1

    log_path = Path(oauth_broker.env["KAFKA_HOME_DIR"]) / f"worker-{suffix}.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "worker.cli", "run", *connect, *topic_args,
                "--group-id", f"oauth-{suffix}", "--metrics-port", "0", "--session-timeout-ms", "6000",
                *model_args(QWEN3_CONFIG),
            ],
            env=env, cwd=REPO_ROOT, stdout=log, stderr=log,
        )  # fmt: skip
    sequences = generate_sequences(3, seed=17, prefix=f"oauth-{suffix}")
    count = sum(len(s.envelopes) for s in sequences)

    async def body() -> list[Any]:
        # The test's own clients use the PLAINTEXT listener: only the worker's must authenticate.
        producer = AIOKafkaProducer(bootstrap_servers=oauth_broker.plaintext, enable_idempotence=True)
        await producer.start()
        try:
            for sequence in sequences:
                for envelope in sequence.envelopes:
                    await producer.send(
                        topics["--input-topic"], orjson.dumps(envelope), key=envelope["request_id"].encode()
                    )
            await producer.send(topics["--input-topic"], b"not json", key=b"poison")
            await producer.flush()
        finally:
            await producer.stop()
        reader = await TopicReader(oauth_broker.plaintext, topics["--output-topic"]).start()
        try:
            await reader.wait_for(count, 180, "outputs", lambda: log_path.read_text(errors="replace")[-3000:])
        finally:
            await reader.stop()
        return reader.records

    try:
        outputs = asyncio.run(body())
    finally:
        worker.terminate()
        status = worker.wait(60)
    assert status == 0, log_path.read_text(errors="replace")[-3000:]
    assert len(outputs) == count
    assert len(token_endpoint.requests) > fetched  # the worker fetched its own token

    replay = _cli("dlq", "replay", "--dry-run", *connect, *topic_args, env=env)
    assert replay.returncode == 0, replay.stderr
    assert "malformed JSON" in replay.stdout
    # Without a token the same command cannot get in.
    refused = _cli(
        "dlq", "replay", "--dry-run", *connect, *topic_args, env=_cli_env(token_endpoint, "nope"), timeout=180
    )
    assert refused.returncode != 0
