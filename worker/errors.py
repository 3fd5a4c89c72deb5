"""The one exception hierarchy of derender-worker.

``DerenderWorkerError`` is the root of every error the package raises on purpose, core, runtime and
commands alike (``except DerenderWorkerError`` is what the CLI turns into a one-line message).
``RequestError`` carries what vLLM would answer over HTTP (status code, error type, param) so a
rejected record becomes an output envelope with vLLM's error body. ``InvalidRecordError`` is a record
that is not an envelope at all: it goes to the dead-letter output.

Not here, on purpose: the private signals a parser module raises and catches itself (``_Partial``,
``_NotACall``, ``_JsonSyntaxError``, ``Unsupported``). One that escaped would be a bug, and rooting it
here would turn its traceback into the CLI's one-line message.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

from schemas.bounds import MAX_TOKEN_ID


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
    """A well-formed envelope whose body vLLM would reject; becomes an error output record.

    Most take the record's ``seq`` and leave the request open (its next record goes on);
    ``ends_request`` ones fail the request, as its state can no longer go on.
    """

    ends_request: ClassVar[bool] = False

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


class TokenIdRangeError(RequestError):
    """A token id no tokenizer can take (outside 0..2**32-1) reached a parser that decodes it:
    vLLM's tokenizer raises there and its endpoint answers 400; this says which id."""

    def __init__(self, token_id: int) -> None:
        super().__init__(f"token id {token_id} is outside the tokenizer's id range 0..{MAX_TOKEN_ID}")
        self.token_id = token_id


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


class SequenceGapError(SequenceError):
    """Records of the request are missing (its ``seq`` skips ahead, or a later ``seq`` comes without
    state): 409, and the request fails."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=409, error_type="SequenceGapError", param="seq")


class ParseBudgetExceededError(RequestError):
    """A tool parser read more than the parse budget allows (vLLM's re-read of a call, at every
    record, on output shaped so): the request fails, the partition goes on."""

    ends_request = True

    def __init__(self, message: str) -> None:
        super().__init__(message, code=400, error_type="ParseBudgetExceededError")


class RequestStateTooLargeError(RequestError):
    """A request's state (context plus choice states) would pass the per-request limit: the
    request fails, the partition goes on."""

    ends_request = True

    def __init__(self, message: str) -> None:
        super().__init__(message, code=413, error_type="RequestStateTooLargeError")


# --- the core's parsers ---------------------------------------------------------------------------


class ParserSetupError(DerenderWorkerError):
    """A parser cannot be built for this tokenizer or these request settings.

    Raised at startup (the facade turns it into ``ConfigurationError``) or per
    request when a request setting selects a variant the tokenizer cannot serve
    (vLLM answers 500 one-shot and 400 streaming then).
    """


# --- the Kafka runtime --------------------------------------------------------------------------


class IllegalTransitionError(DerenderWorkerError):
    """The worker's lifecycle was asked for a transition its table does not have (a bug)."""


class IllegalBreakerTransitionError(DerenderWorkerError):
    """A dead-letter breaker was asked for a transition it does not have (a bug)."""


class KafkaClientError(DerenderWorkerError):
    """A Kafka client call failed (either backend's error, mapped here): the cluster's trouble or
    the transaction's, never a record's. The library's own exception is the ``__cause__``."""


class KafkaUnreachableError(KafkaClientError):
    """No broker answered at the bootstrap address."""


class DeliveryFailedError(KafkaClientError):
    """A record of the open transaction / commit was not acknowledged."""


class RecordTooLargeError(DeliveryFailedError):
    """A topic refused a record as larger than its ``max.message.bytes``."""


class ProducerFencedError(KafkaClientError):
    """Another producer with the same transactional id (or a newer group generation) took over."""


class PartitionNotAssignedError(KafkaClientError):
    """A call named a partition this consumer is not (or no longer) assigned."""


class KafkaReadTimeoutError(KafkaClientError):
    """A group-less read of offset ranges (a state restore, its replay) did not reach the ranges'
    ends within its deadline."""


class GroupRejectedError(KafkaClientError):
    """The group coordinator refused the member for a reason only configuration can fix."""

    class Reason(enum.Enum):
        SESSION_TIMEOUT = "session timeout"
        GROUP_ID = "group id"
        PROTOCOL = "group protocol"
        GROUP_AUTHORIZATION = "group authorization"
        TOPIC_AUTHORIZATION = "topic authorization"

    def __init__(self, reason: GroupRejectedError.Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TokenError(DerenderWorkerError):
    """No SASL token could be had; aiokafka fails the connection attempt and retries it."""


class ReplayError(DerenderWorkerError):
    """``dlq replay`` could not finish (no progress, a send failed)."""


# --- commands -------------------------------------------------------------------------------------


class AuditUsageError(DerenderWorkerError):
    """``audit``: bad flags, an unreadable file, an unreachable broker: exit status 2."""


class DemoError(DerenderWorkerError):
    """A step of the demo failed; the message says which and why."""


class UpstreamError(DerenderWorkerError):
    """vLLM's render or generate answered an error (or none): its ``ErrorResponse`` body in ``error``."""

    def __init__(self, code: int, message: str, type_: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.error: dict[str, Any] = {
            "message": message,
            "type": type_ or ("BadGatewayError" if code == 502 else "UpstreamError"),
            "param": param,
            "code": code,
        }
