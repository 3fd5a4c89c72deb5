"""The one configuration root: every `run` setting reaches the configuration, `X=0` is kept or refused.

Parametrised over the declared settings (``worker.settings.RUN_SECTIONS``), so a new setting is
covered without touching this file.
"""

from __future__ import annotations

import argparse
import enum
import re
import subprocess
import sys
from typing import Any

import pytest
from pydantic.fields import FieldInfo

from tests.paths import REPO_ROOT
from worker.cli import build_parser, main
from worker.errors import ConfigurationError
from worker.runtime.composition import load_derenderer, worker_parts
from worker.runtime.security.from_settings import kafka_security
from worker.runtime.security.kafka_security import Secret
from worker.settings import (
    RUN_SECTIONS,
    RUN_SETTINGS_BY_ENV,
    AuditOptions,
    DlqReplaySelection,
    ModelSettings,
    ProduceOptions,
    RunConfig,
    Section,
    SecuritySettings,
    flags_of,
    load,
    setting_text,
    vars_of,
)

REQUIRED = ["--tokenizer", "model-dir", "--bootstrap-servers", "k:9092"]
A_FILE = __file__  # the TLS flags only check that their file exists
SASL = ["--security-protocol", "SASL_PLAINTEXT"]
PASSWORD = [*SASL, "--sasl-mechanism", "PLAIN", "--sasl-username", "u", "--sasl-password", "p"]
OAUTH = [
    *SASL,
    "--sasl-mechanism",
    "OAUTHBEARER",
    "--sasl-oauth-token-endpoint",
    "https://idp/token",
    "--sasl-oauth-client-id",
    "c",
    "--sasl-oauth-client-secret",
    "s",
]
# The other flags a security setting needs to be accepted at all (its own flag comes last and wins).
CONTEXT: dict[str, list[str]] = {
    "sasl_mechanism": PASSWORD,
    "sasl_username": PASSWORD,
    "sasl_password": PASSWORD,
    "sasl_oauth_token_endpoint": OAUTH,
    "sasl_oauth_client_id": OAUTH,
    "sasl_oauth_client_secret": OAUTH,
    "sasl_oauth_scope": OAUTH,
    "aws_region": [*SASL, "--sasl-mechanism", "AWS_MSK_IAM", "--aws-region", "eu-west-1"],
    "security_protocol": [],
    "ssl_cafile": ["--security-protocol", "SSL"],
    "ssl_certfile": ["--security-protocol", "SSL"],
    "ssl_keyfile": ["--security-protocol", "SSL", "--ssl-certfile", A_FILE],
    "ssl_key_password": ["--security-protocol", "SSL"],
    "ssl_check_hostname": ["--security-protocol", "SSL"],
}
# A value other than the default, where the type alone does not give one that can work.
VALUES: dict[str, list[str]] = {
    "security_protocol": ["SSL"],
    "sasl_mechanism": ["SCRAM-SHA-256"],
    "sasl_oauth_token_endpoint": ["https://other-idp/token"],
    "ssl_cafile": [A_FILE],
    "ssl_certfile": [A_FILE],
    "ssl_keyfile": [A_FILE],
    "reasoning_parser": ["qwen3"],
    "tool_parser": ["hermes"],
    "dlq_min_records": ["30"],
}


def _run_settings() -> list[tuple[type[Section], str]]:
    return [(section, name) for section in RUN_SECTIONS for name in section.model_fields]


def _other_value(name: str, field: FieldInfo) -> list[str]:
    """Command-line words for a valid value of ``field`` that is not its default."""
    if name in VALUES:
        return VALUES[name]
    default = field.default if not field.is_required() else None
    annotation = str(field.annotation)
    if field.annotation is bool:
        return []
    if "tuple" in annotation:
        return ["name-a", "name-b"]
    enum_type = next(
        (t for t in (field.annotation, *getattr(field.annotation, "__args__", ())) if isinstance(t, type)
         and issubclass(t, enum.Enum)),
        None,
    )  # fmt: skip
    if enum_type is not None:
        return [str(next(m for m in enum_type if m is not default).value)]
    if "float" in annotation:
        return [str(float(default or 1.0) * 0.5)]
    if "int" in annotation:
        return ["7" if default is None else str(default + 1)]
    return [f"other-{name}"]


@pytest.mark.parametrize(("section", "name"), _run_settings(), ids=lambda v: getattr(v, "__name__", v))
def test_every_run_flag_changes_the_setting_it_declares(
    section: type[Section], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for env in RUN_SETTINGS_BY_ENV:
        monkeypatch.delenv(env, raising=False)
    field = section.model_fields[name]
    flag = flags_of(name, field)[0]
    words = _other_value(name, field)
    if field.annotation is bool:
        flag = flag if not field.default else "--no-" + flag.removeprefix("--")
    argv = ["run", *REQUIRED, *CONTEXT.get(name, []), flag, *words]
    baseline = ["run", *REQUIRED, *CONTEXT.get(name, [])]
    config = RunConfig.from_args(build_parser().parse_args(argv))
    before = RunConfig.from_args(build_parser().parse_args(baseline))
    (loaded,) = [s for s in vars_of(config) if isinstance(s, section)]
    (default,) = [s for s in vars_of(before) if isinstance(s, section)]
    value: Any = getattr(loaded, name)
    assert value != getattr(default, name), f"{flag} changed nothing"
    if field.annotation is bool:
        assert value is (not field.default)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        assert value == type(value)(words[0])
    else:
        assert setting_text(value) == " ".join(words)
    if section is SecuritySettings:  # and the Kafka clients' options follow
        assert kafka_security(config.security) != kafka_security(before.security)


def test_model_limits_reach_every_processor() -> None:
    """The core's per-request limits are flags too: the processors `run` makes carry them."""
    from tests.golden_cases import derenderer_for
    from tests.kafka_helpers import QWEN3_CONFIG

    args = build_parser().parse_args(
        ["run", *REQUIRED, "--max-request-state-bytes", "1000", "--max-output-bytes", "2000",
         "--max-live-parsers", "0", "--max-record-bytes", "3000"]
    )  # fmt: skip
    config = RunConfig.from_args(args)
    parts = worker_parts(config.kafka, config.model, derenderer_for(QWEN3_CONFIG))
    assert parts.parsers.capacity == 0  # the worker-wide pool
    processor = parts.processor()  # what each owned partition gets
    assert (processor.max_request_state_bytes, processor.max_output_bytes) == (1000, 2000)
    assert (processor.parsers, processor.max_record_bytes) == (parts.parsers, 3000)
    assert processor.admission is parts.budget


def _int_settings() -> list[tuple[type[Section], str, bool]]:
    """Every integer `run` setting, and whether 0 is a value it takes."""
    out = []
    for section, name in _run_settings():
        field = section.model_fields[name]
        if "int" not in str(field.annotation) or field.annotation is bool:
            continue
        bounds = {type(m).__name__: m for m in field.metadata}
        zero_ok = "Gt" not in bounds
        out.append((section, name, zero_ok))
    return out


@pytest.mark.parametrize(
    ("section", "name", "zero_ok"), _int_settings(), ids=lambda v: getattr(v, "__name__", v)
)
def test_zero_from_the_environment_is_kept_or_refused(
    section: type[Section], name: str, zero_ok: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for env in RUN_SETTINGS_BY_ENV:
        monkeypatch.delenv(env, raising=False)
    (env,) = [e for e, declared in RUN_SETTINGS_BY_ENV.items() if declared == (section, name)][:1]
    monkeypatch.setenv(env, "0")
    args = build_parser().parse_args(["run", *REQUIRED])
    if zero_ok:
        (loaded,) = [s for s in vars_of(RunConfig.from_args(args)) if isinstance(s, section)]
        assert getattr(loaded, name) == 0  # never silently the default
    else:
        with pytest.raises(ConfigurationError, match=f"{env}.*greater than 0"):
            RunConfig.from_args(args)


def test_precedence_flag_then_environment_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DERENDER_MAX_LIVE_PARSERS", raising=False)
    parser = build_parser()
    assert RunConfig.from_args(parser.parse_args(["run", *REQUIRED])).model.max_live_parsers == (
        ModelSettings.model_fields["max_live_parsers"].default
    )
    monkeypatch.setenv("DERENDER_MAX_LIVE_PARSERS", "0")
    assert RunConfig.from_args(parser.parse_args(["run", *REQUIRED])).model.max_live_parsers == 0
    flagged = parser.parse_args(["run", *REQUIRED, "--max-live-parsers", "5"])
    assert RunConfig.from_args(flagged).model.max_live_parsers == 5


def test_errors_name_the_flag_and_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DERENDER_MAX_MODEL_LEN", "long")
    assert main(["replay", "--tokenizer", "model-dir", "-"]) == 2
    err = capsys.readouterr().err
    assert "--max-model-len (env DERENDER_MAX_MODEL_LEN)" in err and "'long'" in err
    monkeypatch.delenv("DERENDER_MAX_MODEL_LEN")
    monkeypatch.setenv("DERENDER_SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("DERENDER_SECURITY_PROTOCOL", "KERBEROS")
    with pytest.raises(ConfigurationError, match="DERENDER_SECURITY_PROTOCOL") as refused:
        RunConfig.from_args(build_parser().parse_args(["run", *REQUIRED]))
    assert "hunter2" not in str(refused.value)
    assert Secret("hunter2").reveal() == "hunter2"


def test_help_shows_every_default_and_variable() -> None:
    run = next(
        action.choices["run"] for action in build_parser()._actions if isinstance(action.choices, dict)
    )
    text = run.format_help()
    for section, name in _run_settings():
        for env in RUN_SETTINGS_BY_ENV:
            if RUN_SETTINGS_BY_ENV[env] == (section, name):
                assert env in text, env
    assert len(re.findall(r"\(default:\s", text)) == len(_run_settings())
    assert "qwen3_coder" in text and "deepseek_r1" in text  # parser names, from the registry


def test_the_parse_budget_window_reaches_the_parsers() -> None:
    """``--parse-budget-window`` is what each request's composite parser gets (0: no budget; unset:
    the tool family's own)."""
    from tests.golden_cases import MODELS_DIR
    from tests.parsing_helpers import WEATHER_REQUEST
    from worker.core.parsing.tools.hermes import HermesToolParser

    for flag, expected in (
        (["--parse-budget-window", "0"], 0),
        (["--parse-budget-window", "9"], 9),
        ([], HermesToolParser.reread_window),
    ):
        args = build_parser().parse_args(
            ["run", "--tokenizer", str(MODELS_DIR / "qwen3"), "--bootstrap-servers", "k:9092",
             "--tool-parser", "hermes", "--enable-auto-tool-choice", *flag]
        )  # fmt: skip
        parsing = load_derenderer(RunConfig.from_args(args).model).parsing
        assert parsing is not None
        assert parsing.new_stream(WEATHER_REQUEST, None)._parser.reread_window == expected


# --- settings are data ------------------------------------------------------------------------------

# What importing the settings must not bring in: the runtime, the pipeline, the core's heavy parts
# (tokenizer, parsers, processor), and the libraries they stand on.
NOT_SETTINGS = (
    "worker.runtime",
    "worker.pipeline",
    "worker.core.derenderer",
    "worker.core.envelope_processor",
    "worker.core.live_parsers",
    "worker.core.model_dir",
    "worker.core.parsing",
    "aiokafka",
    "confluent_kafka",
    "tokenizers",
    "transformers",
    "prometheus_client",
    "aiohttp",
)


def test_the_settings_module_imports_no_runtime_module() -> None:
    """A fresh interpreter that imports ``worker.settings`` (and declares every command's flags)
    holds none of the modules the settings configure."""
    code = (
        "import argparse, sys\n"
        "import worker.settings as s\n"
        "sections = [c for c in vars(s).values() if isinstance(c, type) and issubclass(c, s.Section)]\n"
        "for section in sections:\n"
        "    s.add_arguments(argparse.ArgumentParser(), section)\n"
        "print(len(sections))\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO_ROOT
    )
    count, *loaded = done.stdout.split()
    assert int(count) > 20  # the sections were found, so their flags were declared
    assert "worker.settings" in loaded
    assert [name for name in loaded if name.startswith(NOT_SETTINGS)] == []


OUT_OF_BOUNDS: dict[str, list[str]] = {
    "replay": ["replay", "-", "--tokenizer", "m", "--max-logprobs", "-2"],
    "run": ["run", *REQUIRED, "--max-poll-records", "0"],
    "topics create": ["topics", "create", "--bootstrap-servers", "k:9092", "--partitions", "0"],
    "dlq replay": ["dlq", "replay", "--bootstrap-servers", "k:9092", "--limit", "0"],
    "audit": ["audit", "--bootstrap-servers", "k:9092", "--tokenizer", "m", "--from-offset", "-1"],
    "audit, an inverted range": [
        "audit", "--bootstrap-servers", "k:9092", "--tokenizer", "m", "--from-offset", "5", "--to-offset", "5"
    ],
    "produce": ["produce", "-", "--bootstrap-servers", "k:9092", "--topic", ""],
    "consume": ["consume", "--bootstrap-servers", "k:9092", "--topic", "t", "--max-records", "0"],
    "demo": ["demo", "--pace-ms", "-1"],
    "ingest": ["ingest", "--bootstrap-servers", "k:9092", "--max-inflight", "0"],
    "gateway": ["gateway", "--bootstrap-servers", "k:9092", "--allow-no-api-key", "--port", "70000"],
}  # fmt: skip


@pytest.mark.parametrize("argv", OUT_OF_BOUNDS.values(), ids=OUT_OF_BOUNDS.keys())
def test_every_command_refuses_an_out_of_bounds_value_as_a_configuration_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before anything connects or loads: exit 2, one line naming the flag."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    flag = next(word for word in reversed(argv) if word.startswith("--"))
    assert flag in err or "range is empty" in err, err


def test_one_off_flags_have_no_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """What one run of a command reads or writes is never taken from the environment."""
    monkeypatch.setenv("DERENDER_LIMIT", "0")  # would be refused if it were read
    monkeypatch.setenv("DERENDER_TOPIC", "from-the-environment")
    assert load(DlqReplaySelection).limit is None
    with pytest.raises(ConfigurationError, match="--topic is required"):
        load(ProduceOptions)
    assert "env" not in _help_of("consume", "--max-records")


def _help_of(command: str, flag: str) -> str:
    parser = build_parser(command)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (action,) = [a for a in sub.choices[command]._actions if flag in a.option_strings]
    return str(action.help)


def test_a_repeatable_flag_collects_every_value() -> None:
    args = build_parser("audit").parse_args(["audit", "--partition", "1", "--partition", "3"])
    assert load(AuditOptions, args).partitions == (1, 3)
    args = build_parser("audit").parse_args(["audit", "--partition", "-1"])
    with pytest.raises(ConfigurationError, match="--partition: partitions are numbered from 0"):
        load(AuditOptions, args)
