"""Kafka security settings (TLS, SASL) for every aiokafka client the worker makes.

Flags (declared in ``worker.settings.SecuritySettings``), each also an environment variable
(``--sasl-mechanism`` -> ``DERENDER_SASL_MECHANISM``):

* ``--security-protocol``  PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL (default PLAINTEXT)
* ``--sasl-mechanism``     PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 | OAUTHBEARER | AWS_MSK_IAM (required
                           with SASL_*: PLAIN over SASL_PLAINTEXT sends the password in clear, so it is
                           never implied)
* ``--sasl-username`` / ``--sasl-password``  (give the password through the environment, from a
                           Secret: a command-line flag is visible in ``ps``)
* OAUTHBEARER (OIDC client credentials): ``--sasl-oauth-token-endpoint``, ``--sasl-oauth-client-id``,
                           ``--sasl-oauth-client-secret`` (prefer ``DERENDER_SASL_OAUTH_CLIENT_SECRET``),
                           ``--sasl-oauth-scope``; ``OidcTokenProvider`` fetches and refreshes the token
* AWS_MSK_IAM: ``--aws-region`` (else ``AWS_REGION``); credentials from the standard AWS chain; needs
                           the ``msk`` extra (``aws-msk-iam-sasl-signer-python``)
* ``--ssl-cafile`` / ``--ssl-certfile`` / ``--ssl-keyfile`` / ``--ssl-key-password``  PEM files
                           (no CA file: the system's default CAs)
* ``--[no-]ssl-check-hostname``  (default on)

``KafkaSecurity.client_kwargs()`` is splatted into ``AIOKafkaConsumer``, ``AIOKafkaProducer`` and
``AIOKafkaAdminClient`` alike. Secrets are wrapped in ``Secret`` so neither an ``argparse.Namespace``
nor a ``KafkaSecurity`` ever prints them; only ``client_kwargs()`` reveals the password (do not
log that dict).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any

from aiokafka.helpers import create_ssl_context

from worker.errors import ConfigurationError
from worker.kafka_config import SaslMechanism as SaslMechanism
from worker.kafka_config import Secret as Secret
from worker.kafka_config import SecurityProtocol as SecurityProtocol
from worker.runtime.security.kafka_oauth import MskIamTokenProvider, OidcClientCredentials, OidcTokenProvider


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: Secret | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    oauth: OidcClientCredentials | None = None
    aws_region: str | None = None

    def validate(self) -> None:
        """Refuse combinations that would fail at connect time, or silently ignore a setting."""
        p = self.protocol
        if p.uses_sasl:
            if self.sasl_mechanism is None:
                raise ConfigurationError(
                    f"--security-protocol {p} needs --sasl-mechanism (DERENDER_SASL_MECHANISM)"
                )
            self._validate_mechanism()
        else:
            mechanism = [] if self.sasl_mechanism is None else ["--sasl-mechanism"]
            given = mechanism + self._credential_flags_given()
            if given:
                raise ConfigurationError(
                    f"{', '.join(given)} given but --security-protocol is {p}: use SASL_PLAINTEXT or SASL_SSL"
                )
        files = {
            "--ssl-cafile": self.ssl_cafile,
            "--ssl-certfile": self.ssl_certfile,
            "--ssl-keyfile": self.ssl_keyfile,
        }
        if not p.uses_ssl:
            given = [flag for flag, value in files.items() if value] + (
                ["--ssl-key-password"] if self.ssl_key_password is not None else []
            )
            if given:
                raise ConfigurationError(
                    f"{', '.join(given)} given but --security-protocol is {p}: use SSL or SASL_SSL"
                )
            return
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ConfigurationError("--ssl-keyfile needs --ssl-certfile (the client certificate)")
        for flag, path in files.items():
            if path and not os.path.isfile(path):
                raise ConfigurationError(f"{flag} {path!r}: no such file")
            if path and not os.access(path, os.R_OK):
                raise ConfigurationError(f"{flag} {path!r}: not readable")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for SSL / SASL_SSL (else ``None``); bad PEM files are a configuration error."""
        if not self.protocol.uses_ssl:
            return None
        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.ssl_cafile,
                certfile=self.ssl_certfile,
                keyfile=self.ssl_keyfile,
                password=self.ssl_key_password.reveal() if self.ssl_key_password else None,
            )
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot build the Kafka TLS context: {exc}") from exc
        if not self.ssl_check_hostname:
            context.check_hostname = False  # the certificate chain is still verified (CERT_REQUIRED)
        return context

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaConsumer`` / ``AIOKafkaProducer`` / ``AIOKafkaAdminClient``.

        Builds a new ``SSLContext`` per call; call once and share the dict between clients.
        """
        kwargs: dict[str, Any] = {"security_protocol": self.protocol.value}
        context = self.ssl_context()
        if context is not None:
            kwargs["ssl_context"] = context
        if self.protocol.uses_sasl:
            kwargs.update(self._sasl_kwargs())
        return kwargs

    def _credential_flags_given(self) -> list[str]:
        """The SASL credential flags set: username, password, OAuth token endpoint."""
        return [
            flag
            for flag, value in (
                ("--sasl-username", self.sasl_username),
                ("--sasl-password", self.sasl_password),
                ("--sasl-oauth-token-endpoint", self.oauth),
            )
            if value is not None
        ]

    def _validate_mechanism(self) -> None:
        mechanism = self.sasl_mechanism
        assert mechanism is not None
        others = self._credential_flags_given()
        if mechanism.uses_password:
            if not self.sasl_username or self.sasl_password is None:
                raise ConfigurationError(
                    f"--sasl-mechanism {mechanism} needs --sasl-username and --sasl-password "
                    "(DERENDER_SASL_USERNAME / DERENDER_SASL_PASSWORD)"
                )
            if self.oauth is not None:
                raise ConfigurationError(f"--sasl-oauth-* given but --sasl-mechanism is {mechanism}")
            return
        given = [flag for flag in others if flag != "--sasl-oauth-token-endpoint"]
        if given:
            raise ConfigurationError(
                f"{', '.join(given)} given but --sasl-mechanism {mechanism} uses no password"
            )
        if mechanism is SaslMechanism.OAUTHBEARER:
            if self.oauth is None:
                raise ConfigurationError(
                    "--sasl-mechanism OAUTHBEARER needs --sasl-oauth-token-endpoint, --sasl-oauth-client-id "
                    "and DERENDER_SASL_OAUTH_CLIENT_SECRET"
                )
            self.oauth.validate()
            return
        if self.oauth is not None:
            raise ConfigurationError("--sasl-oauth-* given but --sasl-mechanism is AWS_MSK_IAM")
        if not self.aws_region:
            raise ConfigurationError("--sasl-mechanism AWS_MSK_IAM needs --aws-region (or AWS_REGION)")
        MskIamTokenProvider.check_installed()

    def _sasl_kwargs(self) -> dict[str, Any]:
        mechanism = self.sasl_mechanism
        if mechanism is SaslMechanism.OAUTHBEARER:
            assert self.oauth is not None  # validate()
            return {
                "sasl_mechanism": "OAUTHBEARER",
                "sasl_oauth_token_provider": OidcTokenProvider(self.oauth),
            }
        if mechanism is SaslMechanism.AWS_MSK_IAM:
            assert self.aws_region is not None  # validate()
            provider = MskIamTokenProvider(self.aws_region)
            return {"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": provider}
        assert mechanism is not None and self.sasl_password is not None  # validate()
        # aiokafka takes the SCRAM credentials through the sasl_plain_* arguments too.
        return {
            "sasl_mechanism": mechanism.value,
            "sasl_plain_username": self.sasl_username,
            "sasl_plain_password": self.sasl_password.reveal(),
        }

    def describe(self) -> str:
        """A log line without secrets."""
        parts = [f"security_protocol={self.protocol.value}"]
        if self.protocol.uses_sasl and self.oauth is not None:
            parts.append(f"sasl_mechanism={self.sasl_mechanism} {self.oauth.describe()}")
        elif self.protocol.uses_sasl and self.sasl_mechanism is SaslMechanism.AWS_MSK_IAM:
            parts.append(f"sasl_mechanism={self.sasl_mechanism} region={self.aws_region}")
        elif self.protocol.uses_sasl:
            parts.append(f"sasl_mechanism={self.sasl_mechanism} user={self.sasl_username}")
        if self.protocol.uses_ssl:
            parts.append(
                f"ca={self.ssl_cafile or 'system'} client_cert={self.ssl_certfile or '-'} "
                f"check_hostname={self.ssl_check_hostname}"
            )
        return " ".join(parts)
