"""How the Kafka demo looks: the live terminal view (rich) and the plain-text report (not a TTY).

``worker.demo`` runs the demo and updates a :class:`DemoState`; a :class:`DemoView` shows it.
:class:`LiveView` redraws every request's assembled response as its chunks arrive (reasoning,
content and tool calls in their own colours, the choices of an n>1 request side by side);
:class:`PlainView` prints one line per stage and every response once at the end, so a log or
a test sees stable text.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TextIO

from worker.assembly import AssembledChoice, AssembledResponse, render_text

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

# Colours of the three kinds of generated text, used consistently in the live view and summary.
REASONING_STYLE = "italic magenta"
CONTENT_STYLE = "bold"
TOOL_STYLE = "yellow"
TWO_COLUMNS_MIN_WIDTH = 110  # below this, request panels stack instead of pairing up


@dataclass
class RequestProgress:
    """One request of the demo stream: what is expected and what has arrived so far."""

    request_id: str
    endpoint: str
    expected: int  # output chunks: one per valid input record
    response: AssembledResponse | None = None
    workers: set[str] = field(default_factory=set)  # labels of the workers that served it
    partitions: set[int] = field(default_factory=set)  # input partitions (from the envelope's source)

    @property
    def received(self) -> int:
        return self.response.chunks if self.response is not None else 0

    @property
    def done(self) -> bool:
        return self.received >= self.expected


@dataclass(frozen=True)
class DeadLetterSeen:
    key: str | None
    reason: str
    partition: int | None
    offset: int | None


@dataclass
class DemoState:
    """Everything the views show; mutated by ``worker.demo`` only."""

    bootstrap: str = ""
    broker_origin: str = ""
    group: str = ""
    worker_partitions: dict[str, list[int]] = field(default_factory=dict)  # label -> input partitions
    to_produce: int = 0
    produced: int = 0
    invalid_injected: list[str] = field(default_factory=list)  # what each invalid record is
    requests: dict[str, RequestProgress] = field(default_factory=dict)
    dead_letters: list[DeadLetterSeen] = field(default_factory=list)
    chunks: int = 0
    first_produce_at: float | None = None
    last_output_at: float | None = None

    @property
    def completed(self) -> int:
        return sum(1 for r in self.requests.values() if r.done)

    @property
    def chunks_per_second(self) -> float:
        if self.first_produce_at is None or self.last_output_at is None:
            return 0.0
        elapsed = self.last_output_at - self.first_produce_at
        return self.chunks / elapsed if elapsed > 0 else 0.0

    def final_line(self) -> str:
        """The demo's last stdout line (a stable, parseable format)."""
        return (
            f"demo: {self.completed} sequences, {self.chunks} chunks, "
            f"{len(self.dead_letters)} dead-lettered, {self.chunks_per_second:.1f} chunks/s"
        )


class Stage(Protocol):
    def update(self, detail: str) -> None: ...


class DemoView(Protocol):
    def stage(self, title: str) -> AbstractContextManager[Stage]:
        """A step that may take a while (shows progress on a terminal); ``done`` note on exit."""
        ...

    def note(self, text: str) -> None: ...

    def streaming(self, state: DemoState) -> AbstractContextManager[Callable[[], None]]:
        """While records flow: yields ``refresh``, to call after each change of ``state``."""
        ...

    def report(self, state: DemoState) -> None: ...


def make_view(out: TextIO | None = None) -> DemoView:
    """The live view on a terminal (if rich is installed), else plain text."""
    out = out or sys.stdout
    if out.isatty():
        try:
            return LiveView(out)
        except ImportError:  # rich is optional: the plain report says everything too
            pass
    return PlainView(out)


# --- plain text ----------------------------------------------------------------------------------


class _NoDetail:
    def update(self, detail: str) -> None:
        pass


class PlainView:
    """No cursor movement, no colour: stage lines, then every response and the summary."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def _line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    @contextmanager
    def stage(self, title: str) -> Iterator[Stage]:
        started = time.monotonic()
        self._line(f"{title} ...")
        yield _NoDetail()
        self._line(f"{title}: done in {time.monotonic() - started:.1f} s")

    def note(self, text: str) -> None:
        self._line(text)

    @contextmanager
    def streaming(self, state: DemoState) -> Iterator[Callable[[], None]]:
        self._line(
            f"streaming {state.to_produce} records ({len(state.invalid_injected)} deliberately invalid) "
            f"for {len(state.requests)} requests ..."
        )
        yield lambda: None

    def report(self, state: DemoState) -> None:
        self._line("")
        for request in state.requests.values():
            if request.response is None:
                self._line(f"== {request.request_id}: no output arrived")
                continue
            self._line(render_text(request.response))
            self._line(f"   served by {_served_by(request)}")
        self._line("")
        for text in _summary_lines(state):
            self._line(text)


# --- live terminal view --------------------------------------------------------------------------


class _StatusStage:
    def __init__(self, console: Console, title: str) -> None:
        self.title = title
        self.started = time.monotonic()
        self.status = console.status(title, spinner="dots")

    def update(self, detail: str) -> None:
        elapsed = time.monotonic() - self.started
        self.status.update(f"{self.title} [dim]({elapsed:.0f} s) {_escape(detail)}[/dim]")


class LiveView:
    """rich renders the panels: it measures emoji and CJK widths, wraps, and redraws in place."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console

        self.console = Console(file=out, highlight=False)

    @contextmanager
    def stage(self, title: str) -> Iterator[Stage]:
        stage = _StatusStage(self.console, title)
        with stage.status:
            yield stage
        elapsed = time.monotonic() - stage.started
        self.console.print(f"[green]✓[/green] {_escape(title)} [dim]({elapsed:.1f} s)[/dim]")

    def note(self, text: str) -> None:
        self.console.print(f"  [dim]{_escape(text)}[/dim]")

    @contextmanager
    def streaming(self, state: DemoState) -> Iterator[Callable[[], None]]:
        from rich.live import Live

        # No auto-refresh: rich's refresh thread would read `state` while the demo mutates it.
        with Live(
            get_renderable=lambda: self._board(state),
            console=self.console,
            auto_refresh=False,
            vertical_overflow="ellipsis",  # cropped while live; rich prints it whole on stop
        ) as live:
            last = 0.0

            def refresh() -> None:
                nonlocal last
                now = time.monotonic()
                if now - last >= 1 / 15:  # enough for the eye, cheap for the terminal
                    last = now
                    live.refresh()

            yield refresh
            live.refresh()

    def _board(self, state: DemoState) -> RenderableType:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        header = Text.assemble(
            ("Kafka ", "dim"),
            (state.bootstrap, "bold"),
            ("  ·  group ", "dim"),
            (state.group, ""),
            ("  ·  ", "dim"),
            "  ".join(f"{w}: p{','.join(map(str, ps))}" for w, ps in state.worker_partitions.items()),
        )
        progress = Text.assemble(
            ("produced ", "dim"),
            (f"{state.produced}/{state.to_produce}", "bold"),
            (" records  ·  read ", "dim"),
            (str(state.chunks), "bold"),
            (" chunks  ·  ", "dim"),
            (f"{len(state.dead_letters)} dead-lettered", "red" if state.dead_letters else "dim"),
            ("  ·  legend: ", "dim"),
            ("reasoning", REASONING_STYLE),
            " ",
            ("content", CONTENT_STYLE),
            " ",
            ("tool calls", TOOL_STYLE),
        )
        panels = [_request_panel(r) for r in state.requests.values()]
        if self.console.width >= TWO_COLUMNS_MIN_WIDTH:
            grid = Table.grid(expand=True, padding=(0, 1))
            grid.add_column(ratio=1)
            grid.add_column(ratio=1)
            for i in range(0, len(panels), 2):
                grid.add_row(*panels[i : i + 2])
            body: RenderableType = grid
        else:
            body = Group(*panels)
        return Group(header, progress, body, _dead_letter_panel(state))

    def report(self, state: DemoState) -> None:
        from rich.table import Table

        table = Table(title="summary", title_justify="left", expand=False)
        for column in ("request", "endpoint", "served by", "chunks", "finish"):
            table.add_column(column)
        for r in state.requests.values():
            finishes = ""
            if r.response is not None:
                finishes = ", ".join(str(c.finish_reason) for _, c in sorted(r.response.choices.items()))
            table.add_row(
                r.request_id, r.endpoint, _served_by(r), f"{r.received}/{r.expected}", finishes or "-"
            )
        self.console.print(table)
        for text in _summary_lines(state):
            self.console.print(_escape(text))


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _choice_grid(choice: AssembledChoice) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(ratio=1)
    if choice.reasoning.strip():
        grid.add_row("reasoning", Text(choice.reasoning.strip(), style=REASONING_STYLE))
    if choice.content.strip():
        grid.add_row("content", Text(choice.content.strip(), style=CONTENT_STYLE))
    for call in choice.tool_calls.values():
        function = call["function"]
        grid.add_row("tool call", Text(f"{function['name']}({function['arguments']})", style=TOOL_STYLE))
    return grid


def _request_panel(request: RequestProgress) -> RenderableType:
    """One request; the finish reason, usage and who served it sit in the border to save lines."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    response = request.response
    facts = [_served_by(request), f"{request.received}/{request.expected}"]
    if response is None:
        body: RenderableType = Text("waiting for the first chunk ...", style="dim")
        border = "dim"
    elif response.error is not None:
        body = Text(f"error {response.error.get('code')}: {response.error.get('message')}", style="red")
        border = "red"
    else:
        choices = [response.choices[i] for i in sorted(response.choices)]
        if len(choices) > 1:
            # n>1: the choices side by side, each under its index and finish reason.
            table = Table(box=None, expand=True, padding=(0, 2, 0, 0), show_edge=False)
            for choice in choices:
                finish = f" · {choice.finish_reason}" if choice.finish_reason else ""
                table.add_column(f"choice {choice.index}{finish}", ratio=1, header_style="bold cyan")
            table.add_row(*(_choice_grid(c) for c in choices))
            body = table
        else:
            body = _choice_grid(choices[0]) if choices else Text("")
            if choices and choices[0].finish_reason:
                facts.append(choices[0].finish_reason)
        if response.usage:
            facts.append(f"usage {response.usage['prompt_tokens']}+{response.usage['completion_tokens']}")
        border = "green" if request.done else "yellow"
    if response is not None and not request.done:
        facts.append("streaming")
    return Panel(
        body,
        title=f"[bold]{_escape(request.request_id)}[/bold] [dim]{request.endpoint}[/dim]",
        title_align="left",
        subtitle=f"[dim]{_escape(' · '.join(facts))}[/dim]",
        subtitle_align="right",
        border_style=border,
    )


def _dead_letter_panel(state: DemoState) -> RenderableType:
    from rich.panel import Panel
    from rich.text import Text

    # One line per letter, cut at the terminal's width: the panel must not push requests off screen.
    text = Text(no_wrap=True, overflow="ellipsis")
    if not state.dead_letters:
        text.append("none yet", style="dim")
    for i, letter in enumerate(state.dead_letters):
        if i:
            text.append("\n")
        where = f"p{letter.partition}@{letter.offset}" if letter.partition is not None else "?"
        text.append("✗ ", style="red")
        text.append(f"key {letter.key} {where}: ", style="dim")
        text.append(_shorten(letter.reason, 200))
    injected = f"{len(state.invalid_injected)} invalid records injected on purpose"
    return Panel(
        text,
        title=f"dead-letter topic [dim]({injected})[/dim]",
        title_align="left",
        border_style="red",
    )


# --- shared text ---------------------------------------------------------------------------------


def _served_by(request: RequestProgress) -> str:
    if not request.workers and not request.partitions:
        return "not served yet"
    workers = ", ".join(sorted(request.workers)) or "unknown worker"
    partitions = ", ".join(str(p) for p in sorted(request.partitions))
    return f"{workers} (partition {partitions})"


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _summary_lines(state: DemoState) -> list[str]:
    lines = []
    per_worker: dict[str, int] = {}
    for request in state.requests.values():
        for worker in request.workers:
            per_worker[worker] = per_worker.get(worker, 0) + request.received
    for worker, partitions in state.worker_partitions.items():
        lines.append(
            f"{worker}: input partitions {', '.join(map(str, partitions))}, "
            f"served {per_worker.get(worker, 0)} chunks"
        )
    injected = "; ".join(state.invalid_injected)
    lines.append(
        f"dead letters: {len(state.dead_letters)} read from the dead-letter topic; "
        f"{len(state.invalid_injected)} invalid records were injected on purpose ({injected})"
    )
    for letter in state.dead_letters:
        lines.append(f"  key {letter.key}: {_shorten(letter.reason, 140)}")
    lines.append(
        f"{state.completed} of {len(state.requests)} requests complete, {state.chunks} chunks; the rate is "
        "set by the demo's producer pace, not the worker's speed (see `./run bench`)"
    )
    return lines
