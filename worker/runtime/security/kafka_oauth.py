"""SASL/OAUTHBEARER tokens for aiokafka: OIDC client credentials, and AWS MSK IAM.

aiokafka asks its ``sasl_oauth_token_provider`` for a token each time a connection authenticates.
Both providers here cache the token and fetch a new one once less than ``REFRESH_MARGIN`` of its
lifetime is left (at least ``MIN_REFRESH_S`` seconds before it expires), so a connection never
starts with a token about to expire. One provider is shared by every client built from one
``KafkaSecurity.client_kwargs()`` dict, so they share one token. aiokafka does not re-authenticate
an open connection (KIP-368): a broker with ``connections.max.reauth.ms`` closes it when its token
expires and the client reconnects with a fresh one.

* ``OidcTokenProvider``: the client credentials grant (RFC 6749 section 4.4) against an OIDC token
  endpoint, client id and secret sent with HTTP Basic authentication, optional ``scope``. The
  endpoint must be ``https`` (plain ``http`` only on a loopback address), and a redirect is an
  error, never followed: following one would send the client credentials to wherever it points.
* ``MskIamTokenProvider``: ``aws-msk-iam-sasl-signer-python`` (the ``msk`` extra) signs a token from
  the standard AWS credential chain (environment, profile, IRSA web identity, instance role).
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiokafka.abc import AbstractTokenProvider

from worker.errors import ConfigurationError, TokenError

log = logging.getLogger(__name__)

REFRESH_MARGIN = 0.2  # refresh when less than this share of the token's lifetime is left
MIN_REFRESH_S = 5.0
DEFAULT_LIFETIME_S = 300.0  # a token endpoint that does not say (no expires_in)
HTTP_TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 1024 * 1024


class _Secret(Protocol):
    def reveal(self) -> str: ...


@dataclass(frozen=True, slots=True)
class OidcClientCredentials:
    token_endpoint: str
    client_id: str
    client_secret: _Secret | None
    scope: str | None = None

    def validate(self) -> None:
        if not self.token_endpoint:
            raise ConfigurationError("--sasl-mechanism OAUTHBEARER needs --sasl-oauth-token-endpoint")
        url = urllib.parse.urlsplit(self.token_endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigurationError(
                f"--sasl-oauth-token-endpoint must be an https URL, got {self.token_endpoint!r}"
            )
        if url.scheme == "http" and not is_loopback(url.hostname):
            # The client secret would cross the network in clear text.
            raise ConfigurationError(
                "--sasl-oauth-token-endpoint must be https (http only on a loopback address), "
                f"got {self.token_endpoint!r}"
            )
        if not self.client_id or self.client_secret is None:
            raise ConfigurationError(
                "OAUTHBEARER needs --sasl-oauth-client-id and DERENDER_SASL_OAUTH_CLIENT_SECRET"
            )

    def describe(self) -> str:
        return f"token_endpoint={self.token_endpoint} client_id={self.client_id} scope={self.scope or '-'}"


def is_loopback(host: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1``: traffic that never leaves the machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx ends the fetch as an HTTP error: the credentials are never resent elsewhere."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


# Proxies and TLS as urllib's default opener, without its redirect handling.
_OPENER = urllib.request.build_opener(_NoRedirects)


class _CachingProvider(AbstractTokenProvider):  # type: ignore[misc]
    """Caches one token, refreshed before it expires; fetches run in a thread (blocking I/O)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock: asyncio.Lock | None = None
        self.fetches = 0

    async def token(self) -> str:
        if self._token is not None and self._clock() < self._refresh_at:
            return self._token
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            now = self._clock()
            if self._token is None or now >= self._refresh_at:
                token, expires_at = await asyncio.to_thread(self._fetch)
                self.fetches += 1
                lifetime = max(0.0, expires_at - now)
                self._token = token
                self._refresh_at = expires_at - max(MIN_REFRESH_S, lifetime * REFRESH_MARGIN)
            return self._token

    def fetch(self) -> tuple[str, float]:
        """A new token now, blocking: librdkafka's ``oauth_cb`` (it caches and refreshes itself)."""
        return self._fetch()

    def _fetch(self) -> tuple[str, float]:
        """A new token and the time it expires (``clock`` seconds)."""
        raise NotImplementedError


class OidcTokenProvider(_CachingProvider):
    def __init__(self, credentials: OidcClientCredentials, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        credentials.validate()  # also when built by hand: never an http endpoint elsewhere
        self.credentials = credentials

    def _fetch(self) -> tuple[str, float]:
        c = self.credentials
        assert c.client_secret is not None  # validate()
        form = {"grant_type": "client_credentials"}
        if c.scope:
            form["scope"] = c.scope
        # RFC 6749 2.3.1: both parts form-urlencoded before the Basic scheme joins them.
        secret = urllib.parse.quote(c.client_secret.reveal(), safe="")
        pair = f"{urllib.parse.quote(c.client_id, safe='')}:{secret}"
        basic = base64.b64encode(pair.encode()).decode("ascii")
        request = urllib.request.Request(
            c.token_endpoint,
            data=urllib.parse.urlencode(form).encode("ascii"),
            headers={
                "Authorization": f"Basic {basic}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
            method="POST",
        )
        started = self._clock()
        try:
            with _OPENER.open(request, timeout=HTTP_TIMEOUT_S) as response:
                body = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise TokenError(
                    f"token endpoint {c.token_endpoint} answered HTTP {exc.code}, a redirect: not "
                    "followed (it would resend the client credentials); configure the final URL"
                ) from None
            raise TokenError(f"token endpoint {c.token_endpoint} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise TokenError(f"token endpoint {c.token_endpoint} unreachable: {exc}") from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise TokenError("token endpoint response too large")
        try:
            data = json.loads(body)
        except ValueError:
            raise TokenError("token endpoint did not answer JSON") from None
        token = data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise TokenError("token endpoint answer has no access_token")
        expires_in = data.get("expires_in")
        if isinstance(expires_in, str) and expires_in.isdigit():
            expires_in = int(expires_in)
        lifetime = (
            float(expires_in)
            if isinstance(expires_in, int | float) and expires_in > 0
            else DEFAULT_LIFETIME_S
        )
        log.info("fetched an OAUTHBEARER token from %s (expires in %.0f s)", c.token_endpoint, lifetime)
        return token, started + lifetime


class MskIamTokenProvider(_CachingProvider):
    def __init__(self, region: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.region = region

    @staticmethod
    def check_installed() -> None:
        try:
            import aws_msk_iam_sasl_signer  # noqa: F401
        except ImportError as exc:
            raise ConfigurationError(
                "--sasl-mechanism AWS_MSK_IAM needs the msk extra: pip install 'derender-worker[msk]'"
            ) from exc

    def _fetch(self) -> tuple[str, float]:
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

        try:
            token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(self.region)
        except Exception as exc:  # noqa: BLE001 - botocore: no credentials, bad region, ...
            raise TokenError(f"AWS MSK IAM signing failed: {exc}") from None
        return str(token), float(expiry_ms) / 1000
