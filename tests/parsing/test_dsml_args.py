"""deepseek_v32/deepseek_v4 stream DSML arguments in one pass: the deltas of vLLM's rebuild, O(delta) work.

The reference is vLLM's algorithm (``tests/parsing/test_xml_args_bounded.py``): the arguments JSON
rebuilt from the whole raw text with the DSML regular expressions, only for records whose argument
text holds a ``>`` (its ``arg_structural_chars``). Random DSML (well formed, malformed headers, values
cut by the next ``<｜DSML｜parameter name=``, typed by ``string`` and by the schema) must give the
same deltas; the work per record is checked by counting what the scanner is handed.

Values here hold no ``>``: with one inside an unfinished non-string value whose text so far is valid
JSON, vLLM shows it early (docs/parser-families.md lists this difference).
"""

from __future__ import annotations

import random
from typing import Any

from tests.parsing.test_xml_args_bounded import TOOLS, _rebuild_reference, _run
from tests.parsing_helpers import qwen3, qwen3_encode, records
from worker.core.parsing import ParseRequest
from worker.core.parsing.engine.arguments import ArgEvent
from worker.core.parsing.engine.tools import CallSlot, EngineToolParser
from worker.core.parsing.families import deepseek_dsml
from worker.core.parsing.families.deepseek_dsml import PARAM_CLOSE, PARAM_START, DeepSeekV32ToolParser

D = "｜DSML｜"
HEAD = f'Sure.\n\n<{D}function_calls>\n<{D}invoke name="{{}}">\n'
TAIL = f"</{D}invoke>\n</{D}function_calls>"
VALUES = ["", "x", "12", "3.5", "true", '{"a": 1}', "[1, 2]", '"q"', "\n", " ", "é", "<", "/", '"', "{", "}"]
HEADERS = [
    ' name="{}" string="true">',
    ' name="{}" string="false">',
    ' name="{}">',
    '  name="{}"  string="true" >',
    ' name="{}" string="">',
    'name="{}">',  # no blank: not a header
    ' name="" string="true">',  # empty name: not a header
    ' name="{}" strin="true">',
    ' name="{}" string="true"',
]


def _text(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(0, 5)):
        key = rng.choice(["content", "n", "opts", "flag", "other"])
        value = "".join(rng.choice(VALUES) for _ in range(rng.randint(0, 5)))
        parts += [PARAM_START, rng.choice(HEADERS).format(key), value]
        parts.append(rng.choice([PARAM_CLOSE, PARAM_CLOSE, "", "\n"]))
        parts.append(rng.choice(["", "\n"]))
    for _ in range(rng.randint(0, 2)):
        at = rng.randint(0, len(parts))
        parts.insert(at, rng.choice([PARAM_START, PARAM_CLOSE, " name=", "\n", "x"]))
    name = rng.choice(["write_file", "untyped", "write_file"])
    return HEAD.format(name) + "".join(parts) + (TAIL if rng.random() < 0.8 else "")


class _GatedRebuild(_rebuild_reference(DeepSeekV32ToolParser, lambda raw: None)):  # type: ignore[misc]
    """vLLM's rebuild, run only for records whose argument text holds a ``>``."""

    def _arg_delta(self, slot: CallSlot, raw_delta: str) -> str | None:
        if ">" not in raw_delta:
            return None
        result: str | None = super()._arg_delta(slot, raw_delta)
        return result


def test_one_pass_dsml_arguments_equal_the_rebuild() -> None:
    rng = random.Random(31)
    for _ in range(400):
        text = _text(rng)
        size = len(qwen3_encode(text))
        cuts = sorted(rng.sample(range(1, size), min(size - 1, rng.randint(0, size)))) if size > 1 else []
        finish = rng.random() < 0.7
        ours = _run(DeepSeekV32ToolParser, text, cuts, finish)
        assert ours == _run(_GatedRebuild, text, cuts, finish), (text, cuts)


def test_one_shot_dsml_arguments_follow_the_string_attribute_and_the_schema() -> None:
    raw = (
        f'{PARAM_START} name="content" string="true">5</{D}parameter>'
        f'{PARAM_START} name="n" string="false">7</{D}parameter>'
        f'{PARAM_START} name="opts">{{"a": [1]}}</{D}parameter>'
        f'{PARAM_START} name="flag" string="false">not json'
    )
    assert deepseek_dsml.convert_args(raw, False) == '{"content": "5", "n": 7, "opts": {"a": [1]}}'
    assert deepseek_dsml.convert_args(raw, True) == '{"content": "5", "n": 7, "opts": {"a": [1]}}'


class _Counting:
    def __init__(self) -> None:
        self.fed = 0

    def __call__(self) -> Any:
        inner = deepseek_dsml.DsmlArgScanner()
        counter = self

        class Counted:
            def feed(self, text: str) -> list[ArgEvent]:
                counter.fed += len(text)
                return inner.feed(text)

        return Counted()


def test_each_record_scans_only_its_own_text_in_a_dsml_block_that_never_closes() -> None:
    counting = _Counting()
    arguments = deepseek_dsml.DSML_ARGUMENTS.__class__(
        deepseek_dsml.convert_args,
        counting,
        decode=deepseek_dsml.decode_value,
        structural_chars=frozenset(">"),
    )
    config = deepseek_dsml.deepseek_v32_config()

    class Counted(DeepSeekV32ToolParser):
        @classmethod
        def make_config(cls, tokenizer: Any, chat_template_kwargs: dict[str, Any]) -> Any:
            import dataclasses

            return dataclasses.replace(config, arguments=arguments)

    text = (
        HEAD.format("write_file")
        + f'{PARAM_START} name="content" string="true">'
        + "long value > text " * 150
    )
    loaded, adapter = qwen3()
    request = ParseRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=None)
    parser: EngineToolParser = Counted(adapter, TOOLS, {})
    total = 0
    streamed = ""
    for piece, chunk in records(loaded, [[i] for i in qwen3_encode(text)]):
        before = counting.fed
        delta = parser.stream(piece, chunk, request)
        fed = counting.fed - before
        assert fed <= len(piece) + len(PARAM_CLOSE), (piece, fed)
        total += fed
        for call in delta.tool_calls if delta else []:
            streamed += call.function.arguments or "" if call.function else ""
    assert total <= len(text)
    assert streamed.startswith('{"content": "long value > text long value')
