"""The Batch API's pure parts: the completion window and the output file's lines."""

from __future__ import annotations

import orjson
import pytest

from worker.pipeline.apis.batch import window_seconds
from worker.pipeline.apis.batch_run import output_line


@pytest.mark.parametrize(
    ("window", "seconds"),
    [
        ("24h", 86400),
        ("90m", 5400),
        ("600s", 600),
        ("1d", None),
        (24, None),
        ("720h", 2592000),
        ("721h", None),
        # Its expires_at did not fit the batch record: the create was a text/plain 500.
        ("99999999999999999999h", None),
    ],
)
def test_the_completion_window_is_a_deadline_in_seconds(window: object, seconds: int | None) -> None:
    assert window_seconds(window) == seconds


def test_answers_and_errors_become_openais_batch_output_lines() -> None:
    line, ok = output_line("a", 3, {"id": "chatcmpl-1", "object": "chat.completion"})
    assert ok and orjson.loads(line) == {
        "id": "batch_req_3",
        "custom_id": "a",
        "response": {
            "status_code": 200,
            "request_id": "chatcmpl-1",
            "body": {"id": "chatcmpl-1", "object": "chat.completion"},
        },
        "error": None,
    }
    line, ok = output_line("b", 4, {"error": {"message": "bad", "code": 400}})
    assert not ok and orjson.loads(line)["response"] == {
        "status_code": 400,
        "request_id": "",
        "body": {"error": {"message": "bad", "code": 400}},
    }
