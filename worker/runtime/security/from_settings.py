"""The Kafka security of a command, built from its settings (``SecuritySettings``) and checked.

Apart from ``kafka_security`` so that the settings, which name ``KafkaSecurity`` as a type, and
the security options, which know nothing of flags, do not import each other.
"""

from __future__ import annotations

import argparse
from typing import TypeVar

from worker.runtime.security.kafka_oauth import OidcClientCredentials
from worker.runtime.security.kafka_security import KafkaSecurity
from worker.settings import KafkaConnection, SecuritySettings, load

K = TypeVar("K", bound=KafkaConnection)


def kafka_security(settings: SecuritySettings) -> KafkaSecurity:
    """The TLS / SASL options of every Kafka client, checked (a ``ConfigurationError`` names the flag)."""
    oauth = None
    if (
        settings.sasl_oauth_token_endpoint
        or settings.sasl_oauth_client_id
        or settings.sasl_oauth_client_secret
    ):
        oauth = OidcClientCredentials(
            settings.sasl_oauth_token_endpoint or "",
            settings.sasl_oauth_client_id or "",
            settings.sasl_oauth_client_secret or None,
            settings.sasl_oauth_scope or None,
        )
    security = KafkaSecurity(
        protocol=settings.security_protocol,
        sasl_mechanism=settings.sasl_mechanism,
        sasl_username=settings.sasl_username or None,
        sasl_password=settings.sasl_password or None,
        ssl_cafile=settings.ssl_cafile or None,
        ssl_certfile=settings.ssl_certfile or None,
        ssl_keyfile=settings.ssl_keyfile or None,
        ssl_key_password=settings.ssl_key_password or None,
        ssl_check_hostname=settings.ssl_check_hostname,
        oauth=oauth,
        aws_region=settings.aws_region or None,
    )
    security.validate()
    return security


def with_security(settings: K, security: SecuritySettings) -> K:
    """``settings`` carrying the Kafka security that ``security`` describes (no flag of its own)."""
    settings._security = kafka_security(security)  # a private attribute: not a setting
    return settings


def load_kafka(section: type[K], args: argparse.Namespace) -> K:
    """A Kafka section from the command line, with the security settings built in."""
    return with_security(load(section, args), load(SecuritySettings, args))
