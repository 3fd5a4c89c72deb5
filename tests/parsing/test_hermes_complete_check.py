"""hermes asks whether an open call's body is already one JSON document at every record; the
answer must be json's, also where a brace-ended shortcut skips the parse (only for a body with too
few brackets to nest past json's limit: deeper, the parse's RecursionError is vLLM's answer, see
tests/core/test_deep_model_output.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.core.parsing.tools._partial_json import is_json
from worker.core.parsing.tools.hermes import _SHALLOW, _is_json

BODY = st.text(alphabet='{}[]":, abn0-\\ \u3000', min_size=1, max_size=30)


@given(BODY | st.builds(lambda inner: "{" + inner, BODY) | st.builds(lambda inner: "{" + inner + "}", BODY))
def test_is_json_is_json_loads(text: str) -> None:
    body = text.strip()
    if body:
        shallow = body.count("{") + body.count("[") < _SHALLOW
        assert _is_json(body, shallow) == is_json(body)
