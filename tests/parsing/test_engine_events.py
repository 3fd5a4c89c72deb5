"""How the tool adapter reads a record's engine events: runs of text joined once, arguments as sent.

A call name of 40,000 marker pieces in one record grew by ``+=`` on the call's slot, a copy per piece
(0.35 s); runs are now joined before they are read. Arguments keep their pieces: a family's argument
scanner and its deltas are fed piece by piece (unchanged).
"""

from __future__ import annotations

from worker.core.parsing.engine.config import Event
from worker.core.parsing.engine.machine import EngineEvent
from worker.core.parsing.engine.tools import joined


def test_runs_of_text_reasoning_and_name_are_joined_per_call() -> None:
    events: list[EngineEvent] = [
        (Event.REASONING, "a", 0),
        (Event.REASONING, "b", 0),
        (Event.REASONING_END, "", 0),
        (Event.TEXT, "c", 0),
        (Event.TEXT, "d", 0),
        (Event.CALL_START, "", 0),
        (Event.NAME, "<tool", 0),
        (Event.NAME, "_call>", 0),
        (Event.ARG, "{", 0),
        (Event.ARG, "}", 0),
        (Event.CALL_END, "", 0),
        (Event.CALL_START, "", 1),
        (Event.NAME, "f", 1),
        (Event.NAME, "g", 1),
    ]
    assert joined(events) == [
        (Event.REASONING, "ab", 0),
        (Event.REASONING_END, "", 0),
        (Event.TEXT, "cd", 0),
        (Event.CALL_START, "", 0),
        (Event.NAME, "<tool_call>", 0),
        (Event.ARG, "{", 0),
        (Event.ARG, "}", 0),
        (Event.CALL_END, "", 0),
        (Event.CALL_START, "", 1),
        (Event.NAME, "fg", 1),
    ]


def test_names_of_two_calls_stay_apart() -> None:
    events: list[EngineEvent] = [(Event.NAME, "f", 0), (Event.NAME, "g", 1)]
    assert joined(events) == events
