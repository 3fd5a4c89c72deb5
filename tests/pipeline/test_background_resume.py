"""A background response taken over is converted again from its first chunk: the events must equal the
ones already stored (a follower resumes by ``sequence_number``), so their item ids derive from the
response id instead of being drawn at random."""

from __future__ import annotations

from typing import Any

from tests.api_cases import golden_chunks
from worker.pipeline.apis import responses

CHUNKS = golden_chunks()  # as read back from the output topic: the same records each time


def events_of(response_id: str | None) -> list[dict[str, Any]]:
    base = responses.response_object({"model": "m", "input": "hi"}, "resp_1", 1, "in_progress")
    stream = responses.ResponseStream(base, id_seed=response_id)
    events = stream.start()
    for chunk in CHUNKS:
        events += stream.feed(chunk)
    return events + stream.end()


def test_a_background_responses_events_are_made_again_equal() -> None:
    first, again = events_of("resp_1"), events_of("resp_1")
    assert first == again
    items = [e["item"]["id"] for e in first if e["type"] == "response.output_item.added"]
    assert len(items) == 3 and len(set(items)) == 3  # reasoning, message, function call: each its own
    assert [i.split("_")[0] for i in items] == ["rs", "msg", "fc"]
    assert events_of("resp_2") != first  # another response, other ids


def test_without_a_seed_the_ids_are_drawn_at_random() -> None:
    assert events_of(None) != events_of(None)
