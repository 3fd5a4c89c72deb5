"""Every setting of every command, declared once: flag, environment variable, type, default, help.

A setting is one field of a *section* below (a frozen ``pydantic-settings`` model). From that one
declaration come its flag (``--max-model-len``: the field name with dashes, unless ``Cli(flags=...)``
says otherwise), its environment variable (``DERENDER_MAX_MODEL_LEN``, unless the field's
``validation_alias`` lists others), its type and range checks, its default and its ``--help`` line.
Precedence: a flag given on the command line, else the environment variable, else the default.

A command adds the flags of the sections it uses (``add_arguments``) and builds them from its parsed
arguments (``load``); argparse only collects strings, the sections parse and check them, so a flag
and its environment variable are read and refused the same way (a configuration error: exit 2).
``run`` builds one ``RunConfig`` from its sections. The flags that choose what one run of a command
reads or writes are sections too (``CommandOptions``), without environment variables.

The settings are data and their checks: this module imports only leaf modules of types, enums and
defaults (``kafka_config``, ``defaults``, ``core.limits``, ``core.vllm_version``), never the runtime,
and loads or calls nothing. The composition root (``worker.runtime.composition``) builds the
derenderer, the processors and the worker's parts from them.

Adding a setting is a one-place change: add a field to the section it belongs to (with a help text
and, where a value is impossible, a ``ge``/``gt`` bound); the commands that use the section get the
flag and the environment variable, and ``tests/test_settings.py`` checks that it reaches the
configuration. A new group of settings is a new ``Section`` subclass, added to ``RUN_SECTIONS`` when
``run`` takes it.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeVar

from pydantic import (
    AliasChoices,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from worker.core.limits import (
    DEFAULT_MAX_LIVE_PARSERS,
    DEFAULT_MAX_LOGPROBS,
    DEFAULT_MAX_N_SEQUENCES,
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MAX_REQUEST_STATE_BYTES,
)
from worker.core.parser_names import REASONING_PARSERS, TOOL_PARSERS
from worker.core.vllm_version import DEFAULT_VLLM_VERSION, VllmVersion
from worker.defaults import (
    DEFAULT_MAX_CONSECUTIVE,
    DEFAULT_MAX_RATIO,
    DEFAULT_MAX_RECORD_RETRIES,
    DEFAULT_METRICS_HOST,
    DEFAULT_METRICS_PORT,
    DEFAULT_MIN_RECORDS,
    DEFAULT_WINDOW,
)
from worker.errors import ConfigurationError
from worker.kafka_config import (
    COMMIT_BUDGET_MS,
    MAX_RECORD_BYTES,
    RECORD_BUDGET_MS,
    AssignmentStrategy,
    ClientKind,
    CompressionType,
    GroupProtocol,
    SaslMechanism,
    Secret,
    SecurityProtocol,
    TopicNames,
    TransactionalIdMode,
    transaction_timeout_ms,
    transactional_id,
)

if TYPE_CHECKING:
    from worker.runtime.security.kafka_security import KafkaSecurity

ENV_PREFIX = "DERENDER_"
FALLBACK_BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
_OFF = ("off", "none", "disabled")


@dataclass(frozen=True, slots=True)
class Cli:
    """How a field shows on the command line, where the field name alone does not say it."""

    flags: tuple[str, ...] = ()  # default: ("--" + the field name with dashes,)
    group: str | None = None  # default: the section's GROUP
    default_text: str | None = None  # --help's "default: ..." when the value alone says too little
    choices: Callable[[], Iterable[str]] | None = None  # named in --help (the field checks them)
    repeatable: bool = False  # a tuple field given as ``--flag A --flag B`` (else ``--flag A B``)


class Section(BaseSettings):
    """A group of settings: each field reads its flag's value, else its environment variable."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        validate_by_name=True,
        env_ignore_empty=True,  # DERENDER_X= (empty) means "not set", as it always did
        arbitrary_types_allowed=True,  # Secret, KafkaSecurity
    )
    GROUP: ClassVar[str] = "settings"
    # False: the section's flags have no environment variable (what one run of a command reads or
    # writes, not how a deployment is set up).
    ENVIRONMENT: ClassVar[bool] = True

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if not cls.ENVIRONMENT:
            return (init_settings,)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("*", mode="before")
    @classmethod
    def _enum_by_value(cls, raw: Any, info: ValidationInfo) -> Any:
        """Every enum field takes its member's value case- and ``-``/``_``-insensitively; '' is unset."""
        field = cls.model_fields[info.field_name or ""]
        enum_type = _enum_type(field)
        if enum_type is None or not isinstance(raw, str):
            return raw
        if not raw and type(None) in getattr(field.annotation, "__args__", ()):
            return None
        return _enum_member(enum_type, raw)


S = TypeVar("S", bound=Section)


def _cli(field: FieldInfo) -> Cli:
    return next((m for m in field.metadata if isinstance(m, Cli)), Cli())


def flags_of(name: str, field: FieldInfo) -> tuple[str, ...]:
    return _cli(field).flags or ("--" + name.replace("_", "-"),)


def env_vars_of(name: str, field: FieldInfo, section: type[Section] | None = None) -> tuple[str, ...]:
    """The environment variables of a field (none in a section that reads no environment)."""
    if section is not None and not section.ENVIRONMENT:
        return ()
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice) for choice in alias.choices)
    return (ENV_PREFIX + name.upper(),)


def cli_fields(section: type[Section]) -> dict[str, FieldInfo]:
    """The fields of ``section``: each one is a flag."""
    return dict(section.model_fields)


def _default_text(field: FieldInfo) -> str:
    cli = _cli(field)
    if cli.default_text is not None:
        return cli.default_text
    if field.is_required():
        return "required"
    value = field.default
    if value is None or value == ():
        return "unset"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _help(name: str, field: FieldInfo, section: type[Section]) -> str:
    cli = _cli(field)
    text = field.description or ""
    if cli.choices is not None:
        text += f"; one of: {', '.join(sorted(cli.choices()))}"
    enum_type = _enum_type(field)
    if enum_type is not None:
        text += f"; one of: {', '.join(str(m.value) for m in enum_type)}"
    envs = " or ".join(env_vars_of(name, field, section))
    where = f"; env {envs}" if envs else ""
    # argparse formats help with %: escape the text, which may hold percentages.
    return f"{text} (default: {_default_text(field)}{where})".replace("%", "%%")


def _enum_type(field: FieldInfo) -> type[enum.Enum] | None:
    for candidate in (field.annotation, *getattr(field.annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return candidate
    return None


def _is_bool(field: FieldInfo) -> bool:
    return field.annotation is bool


def _is_list(field: FieldInfo) -> bool:
    return "tuple" in str(field.annotation)


def _declaring(section: type[Section], name: str) -> type[Section]:
    """The class that declares field ``name`` (its GROUP titles the flag in ``--help``)."""
    for cls in section.__mro__:
        if isinstance(cls, type) and issubclass(cls, Section) and name in inspect.get_annotations(cls):
            return cls
    return section


def add_arguments(parser: argparse.ArgumentParser, *sections: type[Section]) -> None:
    """The flags of ``sections``, each in its group; every flag's argparse default is ``None`` (not given)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    seen: set[str] = set()
    for section in sections:
        for name, field in cli_fields(section).items():
            if name in seen:
                continue
            seen.add(name)
            title = _cli(field).group or _declaring(section, name).GROUP
            group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
            kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _help(name, field, section)}
            if not _is_bool(field):
                kwargs["metavar"] = flags_of(name, field)[0].removeprefix("--").replace("-", "_").upper()
            if _is_bool(field):
                kwargs["action"] = argparse.BooleanOptionalAction if field.default else "store_const"
                if not field.default:
                    kwargs["const"] = True
            elif _is_list(field) and _cli(field).repeatable:
                kwargs["action"] = "append"
            elif _is_list(field):
                kwargs["nargs"] = "+"
            elif "Secret" in str(field.annotation):
                kwargs["type"] = Secret  # never shown by the parsed namespace's repr
            group.add_argument(*flags_of(name, field), **kwargs)


def given(section: type[Section], args: argparse.Namespace) -> dict[str, Any]:
    """The flags of ``section`` given on the command line (argparse leaves the others ``None``)."""
    return {
        name: getattr(args, name) for name in cli_fields(section) if getattr(args, name, None) is not None
    }


def load(section: type[S], args: argparse.Namespace | None = None, **values: Any) -> S:
    """``section`` from the given flags (and ``values``), else the environment, else the defaults."""
    flags = given(section, args) if args is not None else {}
    try:
        return section(**flags, **values)
    except ValidationError as exc:
        raise ConfigurationError(describe_errors(section, exc)) from None


def describe_errors(section: type[Section], exc: ValidationError) -> str:
    """One line per refused setting, naming its flag and environment variable (never a secret's value)."""
    by_alias = {env: name for name, field in section.model_fields.items() for env in env_vars_of(name, field)}
    lines = []
    for error in exc.errors():
        key = str(error["loc"][0]) if error["loc"] else ""
        name = by_alias.get(key, key)
        field = section.model_fields.get(name)
        if field is None:
            lines.append(error["msg"])
            continue
        envs = env_vars_of(name, field, section)
        where = flags_of(name, field)[0] + (f" (env {' or '.join(envs)})" if envs else "")
        if error["type"] == "missing":
            lines.append(f"{where} is required")
            continue
        shown = "********" if "Secret" in str(field.annotation) else repr(error.get("input"))
        message = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}: {message}, got {shown}")
    return "; ".join(lines)


def _enum_member(enum_type: type[enum.Enum], raw: Any) -> Any:
    """A member from its value, case- and ``-``/``_``-insensitively (``sasl_ssl``, ``scram_sha_512``)."""
    if not isinstance(raw, str):
        return raw
    wanted = raw.strip().upper().replace("-", "_")
    for member in enum_type:
        if str(member.value).upper().replace("-", "_") == wanted:
            return member
    allowed = " | ".join(str(m.value) for m in enum_type)
    raise ValueError(f"must be one of {allowed}")


def _off_or(raw: Any) -> Any:
    return None if isinstance(raw, str) and raw.strip().lower() in _OFF else raw


def _one_of(names: Callable[[], Iterable[str]], raw: Any) -> Any:
    if raw is None or raw == "":
        return None
    allowed = sorted(names())
    if raw not in allowed:
        raise ValueError(f"unknown name; one of: {', '.join(allowed)}")
    return raw


# --- the model: every command that derenders ----------------------------------------------------


def _reasoning_parser_names() -> Iterable[str]:
    return REASONING_PARSERS.keys()


def _tool_parser_names() -> Iterable[str]:
    return TOOL_PARSERS.keys()


class ModelSettings(Section):
    """The model and the core's limits (flag names are vLLM's): ``replay``, ``run``, ``audit``, ``demo``."""

    GROUP: ClassVar[str] = "model (vLLM's flag names) and per-request limits"

    tokenizer: str = Field(
        description="model directory: tokenizer.json (or .xz), tokenizer_config.json, config.json, "
        "generation_config.json",
    )
    served_model_names: Annotated[
        tuple[str, ...] | None,
        NoDecode,
        Cli(flags=("--served-model-name",), default_text="the tokenizer directory's name"),
    ] = Field(
        None,
        validation_alias=AliasChoices("DERENDER_SERVED_MODEL_NAME"),
        description="name(s) the model answers to; the first is reported (env: space-separated)",
    )
    max_model_len: Annotated[int | None, Cli(default_text="max_position_embeddings from config.json")] = (
        Field(None, gt=0, description="longest sequence, prompt included")
    )
    max_logprobs: int = Field(DEFAULT_MAX_LOGPROBS, ge=-1, description="most logprobs per token (-1: no cap)")
    max_n_sequences: int = Field(DEFAULT_MAX_N_SEQUENCES, gt=0, description="vLLM's VLLM_MAX_N_SEQUENCES")
    vllm_version: Annotated[
        VllmVersion, Cli(default_text=f"{DEFAULT_VLLM_VERSION.value}, the newest supported")
    ] = Field(
        DEFAULT_VLLM_VERSION,
        description="which vLLM's derender the outputs equal, field for field (0.33 or 0.34). A stream "
        "that brings its own stream_state is answered in that state's form (prev_tokens or "
        "prev_token_ids), so a mixed-version fleet loses no text",
    )
    return_tokens_as_token_ids: bool = Field(
        False,
        description="vLLM's --return-tokens-as-token-ids: logprob tokens as 'token_id:N' (vLLM 0.34; "
        "0.33 ignores it); a request's own field wins",
    )
    reasoning_parser: Annotated[str | None, Cli(choices=_reasoning_parser_names)] = Field(
        None, description="splits reasoning from content"
    )
    tool_parser: Annotated[
        str | None, Cli(flags=("--tool-parser", "--tool-call-parser"), choices=_tool_parser_names)
    ] = Field(None, description="extracts tool calls (needs --enable-auto-tool-choice)")
    enable_auto_tool_choice: bool = Field(False, description="let --tool-parser extract tool calls")
    max_record_bytes: int = Field(
        DEFAULT_MAX_RECORD_BYTES, gt=0, description="larger input records are dead-lettered"
    )
    parse_budget_window: Annotated[
        int | None, Cli(default_text="the tool parser's own: 32, pythonic 256")
    ] = Field(
        None,
        ge=0,
        description="characters per record a tool parser may read again (vLLM re-reads some call "
        "shapes at every record), on top of 8 times the text; past it the request is a 400 "
        "(0: no budget, vLLM's unbounded re-read)",
    )
    max_live_parsers: int = Field(
        DEFAULT_MAX_LIVE_PARSERS,
        ge=0,
        description="live parser sessions kept (in `run`: one pool for the whole worker); the least "
        "recently used is rebuilt from state on use (0: none kept)",
    )
    max_request_state_bytes: int = Field(
        DEFAULT_MAX_REQUEST_STATE_BYTES,
        gt=0,
        description="a request's state (context and choice states) past this is a 413 that fails it",
    )
    max_output_bytes: int = Field(
        DEFAULT_MAX_OUTPUT_BYTES,
        gt=0,
        description="an output envelope past this becomes a 413 error record (keep it under the "
        "producers' 16 MiB request size)",
    )

    @field_validator("served_model_names", mode="before")
    @classmethod
    def _split_names(cls, raw: Any) -> Any:
        return tuple(raw.split()) or None if isinstance(raw, str) else raw

    @field_validator("reasoning_parser", mode="before")
    @classmethod
    def _known_reasoning_parser(cls, raw: Any) -> Any:
        return _one_of(_reasoning_parser_names, raw)

    @field_validator("tool_parser", mode="before")
    @classmethod
    def _known_tool_parser(cls, raw: Any) -> Any:
        return _one_of(_tool_parser_names, raw)


# --- Kafka: connection, security, topics, processing -------------------------------------------


def _client_id() -> str:
    return f"derender-worker-{socket.gethostname()}-{os.getpid()}"


def pod_name() -> str | None:
    """The pod's name, as ``--group-instance-id``'s default: ``POD_NAME`` (the downward API) if set,
    else ``HOSTNAME`` inside Kubernetes only (``KUBERNETES_SERVICE_HOST`` set), where it is the pod
    name; elsewhere a host name is no stable identity of one worker (several may share a host)."""
    name = os.environ.get("POD_NAME", "").strip()
    if name:
        return name
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return os.environ.get("HOSTNAME", "").strip() or None
    return None


class KafkaConnection(Section):
    """Where the brokers are: every Kafka command."""

    GROUP: ClassVar[str] = "kafka"

    bootstrap_servers: str = Field(
        validation_alias=AliasChoices(ENV_PREFIX + "BOOTSTRAP_SERVERS", FALLBACK_BOOTSTRAP_ENV),
        min_length=1,
        description="host:port[,host:port...]",
    )
    client_id: Annotated[str, Cli(default_text="derender-worker-<host name>-<pid>")] = Field(
        default_factory=_client_id, min_length=1, description="the Kafka client id"
    )

    # Not a flag: the composition root's ``load_kafka`` builds it from ``SecuritySettings``.
    _security: Any = PrivateAttr(None)

    @property
    def security(self) -> KafkaSecurity:
        if self._security is None:
            raise ConfigurationError(f"{type(self).__name__} was built without its security: use load_kafka")
        security: KafkaSecurity = self._security
        return security

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _strip(cls, raw: Any) -> Any:
        return raw.strip() if isinstance(raw, str) else raw


class SecuritySettings(Section):
    """TLS and SASL for every Kafka client (see ``worker.runtime.security.kafka_security``)."""

    GROUP: ClassVar[str] = "kafka security"

    security_protocol: SecurityProtocol = Field(SecurityProtocol.PLAINTEXT, description="how to connect")
    sasl_mechanism: SaslMechanism | None = Field(
        None, description="required with SASL_PLAINTEXT / SASL_SSL (OAUTHBEARER: OIDC client credentials)"
    )
    sasl_username: str | None = Field(None, description="PLAIN / SCRAM user")
    sasl_password: Secret | None = Field(
        None, description="prefer the environment (from a Secret): a flag shows in the process list"
    )
    sasl_oauth_token_endpoint: str | None = Field(
        None, description="OAUTHBEARER: the OIDC token endpoint (client credentials grant)"
    )
    sasl_oauth_client_id: str | None = Field(None, description="OAUTHBEARER: the client id")
    sasl_oauth_client_secret: Secret | None = Field(
        None, description="OAUTHBEARER: the client secret (prefer the environment, from a Secret)"
    )
    sasl_oauth_scope: str | None = Field(None, description="OAUTHBEARER: scope(s)")
    aws_region: str | None = Field(
        None,
        validation_alias=AliasChoices(ENV_PREFIX + "AWS_REGION", "AWS_REGION"),
        description="AWS_MSK_IAM: the cluster's region",
    )
    ssl_cafile: str | None = Field(None, description="PEM CA bundle (unset: the system's CAs)")
    ssl_certfile: str | None = Field(None, description="PEM client certificate (mTLS)")
    ssl_keyfile: str | None = Field(None, description="PEM client key (mTLS)")
    ssl_key_password: Secret | None = Field(None, description="password of an encrypted --ssl-keyfile")
    ssl_check_hostname: bool = Field(
        True, description="verify that the broker's certificate names the host connected to"
    )

    @field_validator("sasl_password", "sasl_oauth_client_secret", "ssl_key_password", mode="before")
    @classmethod
    def _secret(cls, raw: Any) -> Any:
        return (Secret(raw) if raw else None) if isinstance(raw, str) else raw


class InputTopic(Section):
    GROUP: ClassVar[str] = "topics"

    input_topic: str = Field("derender-requests", min_length=1, description="the worker's input envelopes")


class OutputTopic(Section):
    GROUP: ClassVar[str] = "topics"

    output_topic: str = Field("derender-responses", min_length=1, description="the worker's output envelopes")


class KafkaTopics(KafkaConnection, InputTopic, OutputTopic):
    """The worker's four topics: ``run``, ``topics create``, ``dlq replay``, ``audit``."""

    GROUP: ClassVar[str] = "topics"

    state_topic: str = Field(
        "derender-state",
        min_length=1,
        description="compacted; must have as many partitions as the input topic (partition p holds the "
        "state of input partition p)",
    )
    dlq_topic: str = Field("derender-dead-letters", min_length=1, description="dead letters")

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.input_topic, self.output_topic, self.state_topic, self.dlq_topic)

    @model_validator(mode="after")
    def _distinct(self) -> KafkaTopics:
        names = [self.input_topic, self.output_topic, self.state_topic, self.dlq_topic]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"the four topics must be distinct, got {names}")
        return self


class ProducerSettings(Section):
    """Every producer of records: ``run``, ``dlq replay``, ``audit --emit``, ``produce``, ``ingest``,
    ``gateway``."""

    GROUP: ClassVar[str] = "kafka"

    # Chosen by `./run bench kafka --compression-types` (docs/benchmarks.md): the fewest bytes
    # with either client, at no cost beyond the run-to-run spread of none.
    compression_type: CompressionType = Field(
        CompressionType.ZSTD,
        description="the codec of every produced batch (zstd needs Kafka 2.1+ and readers that support it)",
    )


class ProducingTopics(ProducerSettings, KafkaTopics):
    """The topics and the producer settings of a command that writes records."""

    GROUP: ClassVar[str] = "topics"


class ReplyRoutingMode(enum.Enum):
    """Which output partitions a gateway replica reads (``worker.pipeline.gateway_routing``)."""

    OWNED = "owned"  # key steering: the partitions it owns, and those of its requests
    ALL = "all"  # every partition


class DeliveryMode(enum.Enum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"


_CAPS = "memory caps (per worker; a new request past a cap gets a 503 error output; 0: off)"


class KafkaClientChoice(Section):
    """Which library serves a command's consumer group and transactions: ``run`` and ``ingest``."""

    GROUP: ClassVar[str] = "kafka"

    # The default is chosen by `./run bench kafka` (docs/benchmarks.md).
    kafka_client: ClientKind = Field(
        ClientKind.CONFLUENT,
        description="the Kafka client library of the data path: aiokafka (pure asyncio) or confluent "
        "(librdkafka, KIP-447)",
    )


class KafkaSettings(ProducingTopics, KafkaClientChoice):
    """``run``'s consumer group, commits and memory caps."""

    GROUP: ClassVar[str] = "processing"

    group_id: str = Field("derender-worker", min_length=1, description="the consumer group")
    mode: DeliveryMode = Field(
        DeliveryMode.EXACTLY_ONCE, description="exactly-once (transactions) or at-least-once"
    )
    commit_interval_ms: int = Field(
        100, gt=0, description="how long outputs may wait before their transaction commits"
    )
    request_ttl_s: float = Field(
        300.0, gt=0, description="an open request idle this long is closed with a 408 error output"
    )
    # Chosen by `./run bench state`: state records per input fall ~N-fold, a restore re-reads at
    # most this much input.
    state_checkpoint_interval_ms: int = Field(
        10_000,
        ge=0,
        description="write an open request's progress to the state topic at most this often; a restore "
        "re-reads the input after each request's last checkpoint (0: at every commit)",
    )
    session_timeout_ms: int = Field(
        10_000,
        gt=0,
        description="consumer-group session timeout: how fast a crashed worker's partitions move",
    )
    rebalance_timeout_ms: int = Field(
        30_000,
        gt=0,
        description="how long the group waits for members to rejoin; must hold a batch and a commit",
    )
    max_poll_records: int = Field(500, gt=0, description="records fetched per poll")
    max_uncommitted_records: int = Field(
        5_000, gt=0, description="commit early once this many records are processed but not committed"
    )
    shutdown_timeout_s: float = Field(30.0, gt=0, description="SIGTERM: exit 1 if stopping takes longer")
    transactional_id_mode: TransactionalIdMode = Field(
        TransactionalIdMode.PER_PARTITION,
        description="exactly-once: one transactional producer per input partition, or one per worker "
        "(needs KIP-447: --kafka-client confluent and Kafka 2.5+)",
    )
    # Incremental by default: partitions that stay keep flowing during a scale event
    # (docs/kafka-worker.md, "Group membership").
    partition_assignment_strategy: AssignmentStrategy = Field(
        AssignmentStrategy.COOPERATIVE_STICKY,
        description="classic group protocol: cooperative-sticky (incremental: only moved partitions stop) "
        "or range | roundrobin (eager: every partition stops at each rebalance); aiokafka has no "
        "cooperative-sticky and falls back to roundrobin",
    )
    group_protocol: GroupProtocol = Field(
        GroupProtocol.CLASSIC,
        description="classic, or consumer (KIP-848, Kafka 4.0+, --kafka-client confluent): the broker "
        "assigns incrementally and owns the session timeout",
    )
    group_instance_id: Annotated[str | None, Cli(default_text="$POD_NAME, or $HOSTNAME in Kubernetes")] = (
        Field(
            default_factory=pod_name,
            min_length=1,
            description="static membership: a worker back within --session-timeout-ms under the same id "
            "gets its partitions back without a rebalance ('off')",
        )
    )
    # Estimated live bytes (memory.py); deploy/ sets values sized for its 1 GiB pods (`./run bench flood`).
    max_open_requests: Annotated[int, Cli(group=_CAPS)] = Field(
        20_000, ge=0, description="streamed requests open at once"
    )
    max_state_bytes: Annotated[int, Cli(group=_CAPS)] = Field(
        128 * 1024 * 1024,
        ge=0,
        description="live memory of the open requests and of closed-request memory, estimated in bytes",
    )

    @field_validator("group_instance_id", mode="before")
    @classmethod
    def _instance_id(cls, raw: Any) -> Any:
        return _off_or(raw)

    @model_validator(mode="after")
    def _workable(self) -> KafkaSettings:
        if self.per_worker_transactions and self.kafka_client is ClientKind.AIOKAFKA:
            raise ConfigurationError(
                "--transactional-id-mode per-worker needs KIP-447 (fencing by the group generation), "
                "which aiokafka lacks: use --kafka-client confluent, or --transactional-id-mode per-partition"
            )
        if self.group_protocol is GroupProtocol.CONSUMER:
            if self.kafka_client is ClientKind.AIOKAFKA:
                raise ConfigurationError(
                    "--group-protocol consumer (KIP-848) needs --kafka-client confluent: aiokafka speaks "
                    "only the classic protocol"
                )
            if not self.partition_assignment_strategy.incremental:
                raise ConfigurationError(
                    "--group-protocol consumer assigns on the broker, always incrementally: drop "
                    f"--partition-assignment-strategy {self.partition_assignment_strategy.value}"
                )
        timeout = transaction_timeout_ms(self.transactional_id_mode)
        if self.exactly_once and self.commit_interval_ms + COMMIT_BUDGET_MS > timeout:
            raise ConfigurationError(
                f"--commit-interval-ms {self.commit_interval_ms} leaves no room for the commit within the "
                f"transaction timeout of {timeout} ms (--transactional-id-mode "
                f"{self.transactional_id_mode.value}): use at most {timeout - COMMIT_BUDGET_MS}"
            )
        needed = self.max_poll_records * RECORD_BUDGET_MS + COMMIT_BUDGET_MS
        if self.rebalance_timeout_ms < needed:
            raise ConfigurationError(
                f"--rebalance-timeout-ms {self.rebalance_timeout_ms} is shorter than a batch of "
                f"--max-poll-records {self.max_poll_records} plus a commit ({needed} ms): raise it or "
                "lower --max-poll-records"
            )
        return self

    @property
    def exactly_once(self) -> bool:
        return self.mode is DeliveryMode.EXACTLY_ONCE

    @property
    def per_worker_transactions(self) -> bool:
        return self.exactly_once and self.transactional_id_mode is TransactionalIdMode.PER_WORKER

    def transactional_id(self, partition: int) -> str:
        """Stable per input partition, so the next owner's ``init_transactions`` fences the last one."""
        return transactional_id(self.group_id, self.input_topic, partition)

    def worker_transactional_id(self) -> str:
        """Per worker (KIP-447 fences zombies); a restart with the same client id aborts what its
        predecessor left open at once instead of after the transaction timeout."""
        return transactional_id(self.group_id, self.input_topic, self.client_id)


# --- the rest of `run` ----------------------------------------------------------------------------


class DeadLetterSettings(Section):
    GROUP: ClassVar[str] = (
        "dead-letter circuit breaker (a partition whose records are dead-lettered past these limits "
        "is paused and the worker turns not-ready, until restart or re-assignment)"
    )

    dlq_max_ratio: float | None = Field(
        DEFAULT_MAX_RATIO,
        ge=0.0,
        lt=1.0,
        description="trip when more than this share of the last --dlq-window records is "
        "dead-lettered ('off')",
    )
    dlq_window: int = Field(DEFAULT_WINDOW, gt=0, description="records the ratio looks back on")
    dlq_min_records: int = Field(
        DEFAULT_MIN_RECORDS, gt=0, description="the ratio counts only once the window holds this many records"
    )
    dlq_max_consecutive: int | None = Field(
        DEFAULT_MAX_CONSECUTIVE, gt=0, description="trip after this many dead letters in a row ('off')"
    )

    @field_validator("dlq_max_ratio", "dlq_max_consecutive", mode="before")
    @classmethod
    def _off(cls, raw: Any) -> Any:
        return _off_or(raw)

    @model_validator(mode="after")
    def _consistent(self) -> DeadLetterSettings:
        if self.dlq_min_records > self.dlq_window:
            raise ConfigurationError(
                f"--dlq-min-records must be in [1, --dlq-window={self.dlq_window}], "
                f"got {self.dlq_min_records}"
            )
        return self


class PoisonSettings(Section):
    GROUP: ClassVar[str] = "poison records"

    max_record_retries: int = Field(
        DEFAULT_MAX_RECORD_RETRIES,
        gt=0,
        description="a record that resets its partition this many times in a row is "
        "dead-lettered and skipped",
    )


class LogLevel(enum.Enum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


class LogFormat(enum.Enum):
    TEXT = "text"
    JSON = "json"


class LoggingSettings(Section):
    GROUP: ClassVar[str] = "logging"

    log_level: LogLevel = Field(LogLevel.INFO, description="the lowest level logged")
    log_format: LogFormat = Field(LogFormat.TEXT, description="json: one JSON object per line")
    aiokafka_debug: bool = Field(False, description="keep aiokafka's INFO lines (every retry of an outage)")


class MetricsServerSettings(Section):
    """Where ``/metrics``, ``/healthz`` and ``/readyz`` are served (``run`` and ``ingest``)."""

    GROUP: ClassVar[str] = "metrics and health"

    metrics_port: Annotated[
        int | None, Cli(default_text=f"{DEFAULT_METRICS_PORT}, or a free port when it is taken")
    ] = Field(None, ge=0, le=65535, description="port of /metrics, /healthz, /readyz (0: any free port)")
    metrics_host: str = Field(
        DEFAULT_METRICS_HOST, description="address to bind (0.0.0.0: every interface, loopback included)"
    )


class ObservabilitySettings(MetricsServerSettings):
    GROUP: ClassVar[str] = "tracing"

    otel_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector base URL (http://collector:4318): one span per request, with the "
        "GenAI and messaging attributes; needs the 'otel' extra. OTEL_EXPORTER_OTLP_ENDPOINT works too",
    )


class TopicsCreateSettings(Section):
    GROUP: ClassVar[str] = "topics create"

    partitions: int = Field(
        12, gt=0, description="partitions of every topic; the state topic must match the input topic"
    )
    replication_factor: int = Field(1, gt=0, description="replicas of every topic")


# --- one-off commands: what one run reads or writes (flags only, no environment variable) -----------


def epoch_ms(raw: Any) -> Any:
    """A point in time: epoch milliseconds, or an ISO 8601 time (UTC when it has no offset)."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("must be epoch milliseconds or an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _one_at_most(**given: object) -> None:
    named = [flag for flag, value in given.items() if value is not None]
    if len(named) > 1:
        raise ConfigurationError(f"{' and '.join(named)} exclude each other: give one")


class CommandOptions(Section):
    ENVIRONMENT: ClassVar[bool] = False


class ReplayFileOptions(CommandOptions):
    """``replay``'s own flag (its model flags are ``ModelSettings``)."""

    GROUP: ClassVar[str] = "replay"

    assemble: bool = Field(False, description="also print each assembled response to stderr at the end")


class AuditFiles(CommandOptions):
    GROUP: ClassVar[str] = "files (instead of topics)"

    input_file: str | None = Field(None, min_length=1, description="input envelopes, JSON Lines")
    output_file: str | None = Field(
        None,
        min_length=1,
        description="recorded output envelopes, JSON Lines (e.g. a dump of the output topic)",
    )
    report: Annotated[str | None, Cli(group="results")] = Field(
        None, min_length=1, description="write one JSON line per non-identical request here"
    )
    emit_file: Annotated[str | None, Cli(group="results")] = Field(
        None,
        min_length=1,
        description="write the re-derendered outputs here, as output envelopes (JSON Lines)",
    )


class AuditRange(CommandOptions):
    """``audit``'s range of the input topic, and where a backfill goes."""

    GROUP: ClassVar[str] = "input range (Kafka)"

    from_time: Annotated[int | None, Cli(flags=("--from",))] = Field(
        None, ge=0, description="first record at or after this time (ISO 8601 or epoch ms)"
    )
    from_offset: int | None = Field(None, ge=0, description="first offset, in every partition")
    to_time: Annotated[int | None, Cli(flags=("--to",))] = Field(
        None, ge=0, description="stop before this time (ISO 8601 or epoch ms)"
    )
    to_offset: int | None = Field(None, ge=0, description="stop before this offset, in every partition")
    partitions: Annotated[
        tuple[int, ...] | None, Cli(flags=("--partition",), repeatable=True, default_text="all")
    ] = Field(None, description="audit this input partition (repeatable)")
    emit_topic: str | None = Field(
        None,
        min_length=1,
        description="write the re-derendered outputs to this topic, in one transaction (a backfill)",
    )

    @field_validator("from_time", "to_time", mode="before")
    @classmethod
    def _time(cls, raw: Any) -> Any:
        return epoch_ms(raw)

    @field_validator("partitions")
    @classmethod
    def _partitions(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and any(partition < 0 for partition in value):
            raise ValueError("partitions are numbered from 0")
        return value

    @model_validator(mode="after")
    def _a_range(self) -> AuditRange:
        _one_at_most(**{"--from": self.from_time, "--from-offset": self.from_offset})
        _one_at_most(**{"--to": self.to_time, "--to-offset": self.to_offset})
        if self.from_offset is not None and self.to_offset is not None and self.from_offset >= self.to_offset:
            raise ConfigurationError(
                f"the range is empty or inverted: --from-offset {self.from_offset} is not before "
                f"--to-offset {self.to_offset}"
            )
        if self.from_time is not None and self.to_time is not None and self.from_time >= self.to_time:
            raise ConfigurationError(
                f"the range is empty or inverted: --from ({self.from_time} ms) is not before --to "
                f"({self.to_time} ms)"
            )
        return self

    @property
    def selects_a_range(self) -> bool:
        return any(v is not None for v in (self.from_time, self.from_offset, self.to_time, self.to_offset))


class AuditOptions(AuditFiles, AuditRange):
    """Everything ``audit`` reads or writes besides Kafka and the model."""

    @model_validator(mode="after")
    def _files_or_range(self) -> AuditOptions:
        if self.input_file and (self.selects_a_range or self.partitions is not None):
            raise ConfigurationError(
                "--from/--to/--from-offset/--to-offset/--partition select a range of the input topic, "
                "not of --input-file"
            )
        return self

    @property
    def needs_kafka(self) -> bool:
        return not (self.input_file and self.output_file) or bool(self.emit_topic)


class DlqReplaySelection(CommandOptions):
    """``dlq replay``: which dead letters go back, and where."""

    GROUP: ClassVar[str] = "replay"

    from_offset: int | None = Field(None, ge=0, description="start every partition at this offset")
    since: int | None = Field(
        None,
        ge=0,
        description="start at the first dead letter written at or after this time (ISO 8601 or epoch ms)",
    )
    reason_contains: str | None = Field(
        None, min_length=1, description="replay only dead letters whose reason contains this text"
    )
    to_topic: Annotated[str | None, Cli(default_text="--input-topic")] = Field(
        None, min_length=1, description="the topic the dead letters go back to"
    )
    limit: Annotated[int | None, Cli(default_text="all")] = Field(
        None, gt=0, description="replay at most this many records"
    )
    dry_run: bool = Field(False, description="print what would be sent, send nothing")

    @field_validator("since", mode="before")
    @classmethod
    def _time(cls, raw: Any) -> Any:
        return epoch_ms(raw)

    @model_validator(mode="after")
    def _one_start(self) -> DlqReplaySelection:
        _one_at_most(**{"--from-offset": self.from_offset, "--since": self.since})
        return self


class ProduceOptions(CommandOptions):
    GROUP: ClassVar[str] = "produce"

    topic: str = Field(min_length=1, description="the topic to send to")


class ConsumeOptions(CommandOptions):
    GROUP: ClassVar[str] = "consume"

    topic: str = Field(min_length=1, description="the topic to read")
    follow: bool = Field(False, description="keep reading new records (Ctrl-C stops)")
    from_beginning: Annotated[bool, Cli(default_text="the end")] = Field(
        False, description="start at the oldest record"
    )
    assemble: bool = Field(False, description="print each assembled response of output envelopes to stderr")
    max_records: Annotated[int | None, Cli(default_text="no limit")] = Field(
        None, gt=0, description="stop after this many records"
    )


DEMO_PACE_MS = 50.0  # between produced records: ~85 records in ~4 s, slow enough to watch


class DemoOptions(CommandOptions):
    GROUP: ClassVar[str] = "demo"

    stream: Annotated[str | None, Cli(default_text="the bundled Qwen3 sample")] = Field(
        None, min_length=1, description="input envelopes"
    )
    tokenizer: Annotated[str | None, Cli(default_text="the bundled Qwen3 tokenizer")] = Field(
        None, min_length=1, description="model directory"
    )
    offline: bool = Field(False, description="derender in-process, without Kafka")
    pipeline: bool = Field(
        False, description="the whole pipeline: fake vLLM, ingest, two workers, gateway and an openai client"
    )
    bootstrap_servers: Annotated[
        str | None,
        Cli(
            default_text="DERENDER_BOOTSTRAP_SERVERS, else KAFKA_BOOTSTRAP_SERVERS, else a local broker "
            "started by deploy/local/kafka"
        ),
    ] = Field(None, min_length=1, description="use this Kafka instead of starting a local one")
    pace_ms: float = Field(DEMO_PACE_MS, ge=0, le=60_000, description="pause between produced records")


# --- the pipeline: `ingest` and `gateway` ------------------------------------------------------------


class RequestsTopic(Section):
    GROUP: ClassVar[str] = "topics"

    requests_topic: str = Field(
        "derender-openai-requests", min_length=1, description="request envelopes and cancels"
    )


class IngestOptions(RequestsTopic, InputTopic, OutputTopic, KafkaClientChoice):
    """``ingest``: requests topic -> vLLM render + generate -> the worker's input topic."""

    GROUP: ClassVar[str] = "ingest"

    render_url: str = Field("http://127.0.0.1:8000", min_length=1, description="vLLM's render server")
    generate_url: Annotated[str | None, Cli(default_text="--render-url")] = Field(
        None, description="vLLM's generate server"
    )
    api_key: str | None = Field(None, description="vLLM's --api-key (prefer the environment)")
    group_id: str = Field("derender-ingest", min_length=1, description="ingest's consumer group")
    max_inflight: int = Field(
        256, gt=0, le=100_000, description="generate streams (and one-shot generate calls) open at once"
    )
    max_backlog: int = Field(
        1024,
        ge=0,
        le=1_000_000,
        description="requests read and waiting for a stream slot; past it the requests topic pauses",
    )
    max_backlog_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        le=1 << 40,
        description="bytes of request records held (running or waiting); past it the requests topic pauses",
    )
    max_record_bytes: int = Field(
        DEFAULT_MAX_RECORD_BYTES,
        ge=64 * 1024,
        le=MAX_RECORD_BYTES,
        description=(
            "largest input envelope ingest sends (the worker's --max-record-bytes); "
            "a request whose answer does not fit ends with a 413 error record"
        ),
    )
    render_timeout_s: float = Field(
        60.0, gt=0, le=86_400, description="render (and abort) calls fail with a 504 after this long"
    )
    generate_timeout_s: float = Field(
        600.0, gt=0, le=86_400, description="a one-shot generate call fails with a 504 after this long"
    )
    headers_timeout_s: float = Field(
        60.0, gt=0, le=86_400, description="a streamed generate call that sends no headers this long: 504"
    )
    commit_interval_ms: int = Field(
        20, gt=0, description="how long produced records may wait for their commit"
    )
    stream_idle_timeout_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="a generation silent this long is aborted and fails with a 504 error record",
    )
    abort_grace_s: float = Field(
        10.0, gt=0, description="after a cancel, how long generate may take to end the stream"
    )
    session_timeout_ms: int = Field(10_000, gt=0, description="consumer-group session timeout")
    shutdown_timeout_s: float = Field(
        30.0, gt=0, description="SIGTERM: how long in-flight requests may finish"
    )

    @property
    def generate_endpoint(self) -> str:
        return self.generate_url or self.render_url

    def transactional_id(self, partition: int) -> str:
        """Per requests partition, as the worker's per input partition."""
        return transactional_id(self.group_id, self.requests_topic, partition)

    @model_validator(mode="after")
    def _distinct(self) -> IngestOptions:
        names = [self.requests_topic, self.input_topic, self.output_topic]
        if len(set(names)) != len(names):
            raise ConfigurationError(
                f"--requests-topic, --input-topic and --output-topic must differ, got {names}"
            )
        return self


MiB = 1024 * 1024


class GatewayOptions(RequestsTopic, OutputTopic):
    """``gateway``: the OpenAI-compatible HTTP front of the pipeline (limits: docs/gateway.md)."""

    GROUP: ClassVar[str] = "http"

    host: str = Field("0.0.0.0", description="address to bind")
    vllm_version: Annotated[
        VllmVersion, Cli(default_text=f"{DEFAULT_VLLM_VERSION.value}, the newest supported")
    ] = Field(
        DEFAULT_VLLM_VERSION,
        description="whose request rules a request is checked by before it is queued (0.34: "
        "'tools: []' means no tools, 0.33: a 400); give it the workers' --vllm-version",
    )
    port: int = Field(8000, ge=0, le=65535, description="port to serve on")
    api_keys: Annotated[tuple[str, ...], NoDecode, Cli(flags=("--api-key",))] = Field(
        (),
        validation_alias=AliasChoices("DERENDER_API_KEY"),
        description=(
            "clients must send 'Authorization: Bearer KEY' with one of these keys (several: rotation; "
            "prefer the environment, space-separated)"
        ),
    )
    allow_no_api_key: bool = Field(
        False, description="serve without --api-key (otherwise the gateway refuses to start without one)"
    )
    served_model_names: Annotated[tuple[str, ...], NoDecode, Cli(flags=("--served-model-name",))] = Field(
        (),
        validation_alias=AliasChoices("DERENDER_SERVED_MODEL_NAME"),
        description="the model name(s) GET /v1/models lists (env: space-separated)",
    )
    request_timeout_s: float = Field(
        600.0,
        gt=0,
        description="a request with no new output for this long ends with error 504 (and is cancelled)",
    )
    # --- admission: what one request may ask for ---
    max_body_bytes: int = Field(4 * MiB, gt=0, description="a larger request body is refused with 413")
    max_prompts: int = Field(
        1024, gt=0, le=1024, description="prompts in one completion request (each is one generate stream)"
    )
    max_n: int = Field(128, gt=0, description="choices per prompt ('n')")
    max_logprob_tokens: int = Field(
        131_072,
        gt=0,
        description=(
            "a non-streaming request with logprobs may ask for at most prompts x n x max_tokens x "
            "(top_logprobs + 1) of them: its answer is one record"
        ),
    )
    # --- admission: what is open at once ---
    max_open_requests: int = Field(1024, gt=0, description="open requests in total (more: 503)")
    max_open_requests_per_key: int = Field(256, gt=0, description="open requests per API key (more: 429)")
    max_bytes_in_flight: int = Field(
        192 * MiB, gt=0, description="request bodies plus queued outputs in total (more: 503)"
    )
    max_bytes_in_flight_per_key: int = Field(
        64 * MiB, gt=0, description="request bodies plus queued outputs per API key (more: 429)"
    )
    retry_after_s: int = Field(1, ge=0, description="the Retry-After of a 429 or 503 for a full gateway")
    # --- connections and delivery ---
    header_timeout_s: float = Field(
        15.0, gt=0, description="a connection that has not sent a request's headers in this time is closed"
    )
    body_timeout_s: float = Field(30.0, gt=0, description="reading a request's body may take this long (408)")
    write_timeout_s: float = Field(
        30.0, gt=0, description="a client that takes longer to accept one write is ended (and cancelled)"
    )
    max_queued_bytes: int = Field(
        4 * MiB,
        gt=0,
        description=(
            "output bytes waiting for one slow client; past it the request ends with an error event "
            "and is cancelled (one record is always taken)"
        ),
    )
    shutdown_timeout_s: float = Field(
        20.0, gt=0, description="SIGTERM: open requests are cancelled and the cancels flushed within this"
    )
    # --- trace context from clients ---
    baggage_keys: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="the baggage members a client may pass on (none: a client's baggage is dropped)"
    )
    max_baggage_bytes: int = Field(512, ge=0, description="the baggage passed on is cut to this many bytes")
    trust_client_sampling: bool = Field(
        False, description="keep a client's sampled flag in traceparent (otherwise it is cleared)"
    )
    output_partition_refresh_s: float = Field(
        30.0, gt=0, description="how often the gateway looks for new partitions of the output topic"
    )
    reply_routing: ReplyRoutingMode = Field(
        ReplyRoutingMode.OWNED,
        description=(
            "owned: the replicas share the output partitions (a group) and each reads its share; "
            "all: every replica reads the whole output topic"
        ),
    )
    reply_group_id: str = Field(
        "derender-gateway",
        min_length=1,
        description="the group the replicas share the output partitions in (joined, never committed)",
    )
    responses_topic: str | None = Field(
        None,
        min_length=1,
        description=(
            "compacted topic of stored /v1/responses (store, previous_response_id, background); "
            "unset: responses are not stored"
        ),
    )
    batch_topic: str | None = Field(
        None,
        min_length=1,
        description="compacted topic of /v1/files and /v1/batches (unset: no Batch API)",
    )
    responses_store_max_mb: int = Field(
        256, ge=1, description="MiB of stored responses each gateway keeps in memory (the oldest go first)"
    )
    batch_window: int = Field(
        32,
        ge=1,
        le=1024,
        description=(
            "lines of one batch in flight at once, all within this many lines of its first unanswered "
            "one (what a running batch holds in memory)"
        ),
    )
    batch_max_running: int = Field(
        4, ge=1, le=256, description="batches one gateway runs at once; the others wait, 'validating'"
    )
    takeover_lease_s: float = Field(
        30.0,
        ge=3.0,
        le=600.0,
        description=(
            "a background response or batch whose replica has not renewed its lease for this long is "
            "taken over by another replica (renewed every third of it)"
        ),
    )

    @field_validator("served_model_names", "api_keys", "baggage_keys", mode="before")
    @classmethod
    def _split_names(cls, raw: Any) -> Any:
        return tuple(raw.split()) if isinstance(raw, str) else raw

    @model_validator(mode="after")
    def _key_or_consent(self) -> GatewayOptions:
        if not self.api_keys and not self.allow_no_api_key:
            raise ConfigurationError(
                "the gateway needs --api-key (or DERENDER_API_KEY); --allow-no-api-key serves without one"
            )
        if any(not key for key in self.api_keys):
            raise ConfigurationError("an empty --api-key would let anyone in")
        return self


# `run`'s sections, in --help order; RunConfig holds one of each.
RUN_SECTIONS: tuple[type[Section], ...] = (
    KafkaSettings,
    SecuritySettings,
    ModelSettings,
    DeadLetterSettings,
    PoisonSettings,
    LoggingSettings,
    ObservabilitySettings,
)


def setting_text(value: object) -> str:
    """A setting's value as its flag or environment variable would spell it."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return " ".join(str(item) for item in value)
    if isinstance(value, Secret):
        return value.reveal()
    return str(value)


RUN_SETTINGS_BY_ENV: dict[str, tuple[type[Section], str]] = {
    env: (section, name)
    for section in RUN_SECTIONS
    for name, field in cli_fields(section).items()
    for env in env_vars_of(name, field)
}


def vars_of(config: RunConfig) -> tuple[Section, ...]:
    """The sections of ``config``."""
    return tuple(getattr(config, slot) for slot in RunConfig.__slots__)


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything ``run`` is configured with, checked: built once, read by the composition root."""

    kafka: KafkaSettings  # its ``security`` built from ``security`` below
    security: SecuritySettings
    model: ModelSettings
    dead_letters: DeadLetterSettings
    poison: PoisonSettings
    logging: LoggingSettings
    observability: ObservabilitySettings

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunConfig:
        return cls(
            kafka=load(KafkaSettings, args),
            security=load(SecuritySettings, args),
            model=load(ModelSettings, args),
            dead_letters=load(DeadLetterSettings, args),
            poison=load(PoisonSettings, args),
            logging=load(LoggingSettings, args),
            observability=load(ObservabilitySettings, args),
        )
