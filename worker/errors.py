"""The one exception hierarchy of derender-worker.

``DerenderWorkerError`` is the root. ``RequestError`` carries what vLLM would
answer over HTTP (status code, error type, param) so a rejected record becomes
an output envelope with vLLM's error body. ``InvalidRecordError`` is a record
that is not an envelope at all: it goes to the dead-letter output.
"""

from __future__ import annotations


class DerenderWorkerError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigurationError(DerenderWorkerError):
    """Start-up configuration cannot work (missing model files, unknown parser, bad flag)."""


class InvalidRecordError(DerenderWorkerError):
    """A record that is not a valid envelope: malformed JSON, wrong shape, oversize."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RequestError(DerenderWorkerError):
    """A well-formed envelope whose body vLLM would reject; becomes an error output record."""

    def __init__(
        self,
        message: str,
        *,
        code: int = 400,
        error_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.error_type = error_type
        self.param = param


class ModelNotFoundError(RequestError):
    def __init__(self, model: str, served: str) -> None:
        super().__init__(
            f"The model `{model}` does not exist. Valid aliases: {served}.",
            code=404,
            error_type="NotFoundError",
            param="model",
        )


class SequenceError(RequestError):
    """The record does not fit the request's stream: a gap in ``seq``, or the request expired."""


class RequestStateTooLargeError(RequestError):
    """A request's state (context plus choice states) would pass the per-request limit: the
    request fails, the partition goes on."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=413, error_type="RequestStateTooLargeError")
