"""Cost per record of replay's core on a 2,000-token answer in 1-token records, and of replay itself.

Prints, per tokenizer, the median per-record cost of: envelope parse
(JSON + envelope + body validation), derender, output serialization, and all
of it together through ``EnvelopeProcessor`` (GC kept out of the parts: each
round's outputs are dropped), beside the floor (one raw ``tokenizers`` decode
of all 2,000 ids, divided per token); then the same processor's cost per later 1-token record
of a request whose first record brought a 2,000- and an 8,000-token prompt (what a record costs
must not grow with the prompt). Then the end-to-end figure, in wall and CPU time: ``replay``'s
own path after start-up (``worker.replay.replay_file``: JSON Lines read from a
file, output written to /dev/null, the garbage collector on) over 20,000
one-token records (10 such answers, one after another). vLLM 0.33.0's own
derender measured 267 µs per 1-token chunk in-process on this machine.
"""

from __future__ import annotations

import io
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from schemas.derender import DerenderChatStreamRequest
from schemas.envelope import InputEnvelope
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.vllm_version import VllmVersion
from worker.replay import replay_file
from worker.runtime.composition import load_derenderer, load_processor
from worker.settings import ModelSettings

MODELS = Path(__file__).resolve().parent.parent / "samples" / "models"
VLLM_US_PER_CHUNK = 267.0
TOKENS = 2000
ROUNDS = 5
END_TO_END_ANSWERS = 10  # x TOKENS one-token records through replay
LONG_PROMPTS = (2000, 8000)
LATER_RECORDS = 500  # timed after the first record of each long-prompt request

TEXT = (
    "Derender turns token ids back into text. Café déjà vu — naïve façade. 北京是中国的首都。"
    " Emoji too: 🤗🚀✨👍🏽. Ключи и значения; αβγ δεζ. The quick brown fox jumps over the lazy dog. "
)

MODEL_PROMPTS = {
    "qwen3": [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198],
    "mistral-7b-v0.1": [1, 733, 16289, 28793, 6312, 733, 28748, 16289, 28793],
}


def _records(model: str, ids: list[int], prompt: list[int] | None = None) -> list[bytes]:
    prompt = MODEL_PROMPTS[model] if prompt is None else prompt
    out = []
    for seq, token in enumerate(ids):
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": {"request_id": "bench", "choices": [{"index": 0, "token_ids": [token]}]},
        }
        if seq == 0:
            body |= {
                "model": "bench",
                "prompt_token_ids": prompt,
                "prompt_tokens": len(prompt),
                "chat_request": {"model": "bench", "messages": [{"role": "user", "content": "hi"}]},
            }
        if seq == len(ids) - 1:
            body["generate_chunk"]["choices"][0]["finish_reason"] = "length"
        out.append(orjson.dumps({"request_id": "bench", "seq": seq, "endpoint": "chat", "body": body}))
    return out


def _us_per(seconds: float, count: int) -> float:
    return seconds / count * 1e6


def bench_model(model: str) -> dict[str, float]:
    settings = ModelSettings(
        vllm_version=VllmVersion.V0_34, tokenizer=str(MODELS / model), served_model_names=("bench",)
    )
    derenderer = load_derenderer(settings)
    backend = derenderer.tokenizer.backend
    ids: list[int] = []
    while len(ids) < TOKENS:
        ids.extend(backend.encode(TEXT, add_special_tokens=False).ids)
    ids = ids[:TOKENS]
    records = _records(model, ids)

    figures: dict[str, list[float]] = {k: [] for k in ("parse", "derender", "serialize", "total", "floor")}
    for _ in range(ROUNDS):
        # parse alone
        start = time.perf_counter()
        bodies = []
        for record in records:
            envelope = InputEnvelope.model_validate(orjson.loads(record))
            bodies.append(DerenderChatStreamRequest.model_validate(envelope.body))
        figures["parse"].append(_us_per(time.perf_counter() - start, len(records)))
        for body in bodies[1:]:
            body.chat_request = bodies[0].chat_request
            body.prompt_token_ids = bodies[0].prompt_token_ids

        # derender alone, on pre-parsed bodies (outputs are not kept: holding 2,000 of them
        # makes the garbage collector's cost part of this figure)
        state = None
        start = time.perf_counter()
        for body in bodies:
            chunk, state = derenderer.chat_stream(body, state)
            state.to_wire()
        figures["derender"].append(_us_per(time.perf_counter() - start, len(records)))

        state = None
        outputs = []
        for body in bodies:
            chunk, state = derenderer.chat_stream(body, state)
            outputs.append(
                {
                    "request_id": "bench",
                    "seq": 0,
                    "endpoint": "chat",
                    "body": {"chunk": chunk, "stream_state": state.to_wire()},
                }
            )
        start = time.perf_counter()
        for output in outputs:
            orjson.dumps(output)
        figures["serialize"].append(_us_per(time.perf_counter() - start, len(records)))

        # everything together, as replay runs it (process serializes the output itself)
        processor = EnvelopeProcessor(derenderer)
        start = time.perf_counter()
        for record in records:
            result = processor.process(record)
            assert result.payload is not None
        figures["total"].append(_us_per(time.perf_counter() - start, len(records)))

        start = time.perf_counter()
        backend.decode(ids, skip_special_tokens=True)
        figures["floor"].append(_us_per(time.perf_counter() - start, len(records)))

    # The first record validates the prompt; the later ones must not pay for it again.
    for length in LONG_PROMPTS:
        prompt = (ids * (length // len(ids) + 1))[:length]
        long_records = _records(model, ids, prompt)[: LATER_RECORDS + 1]
        figures[f"later @{length}"] = []
        for _ in range(ROUNDS):
            processor = load_processor(settings)
            processor.process(long_records[0])
            start = time.perf_counter()
            for record in long_records[1:]:
                processor.process(record)
            figures[f"later @{length}"].append(_us_per(time.perf_counter() - start, LATER_RECORDS))

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "records.jsonl"
        with path.open("wb") as out:
            for answer in range(END_TO_END_ANSWERS):
                rid = f'"bench-{answer}"'.encode()
                for record in records:  # request_id and generate_chunk.request_id
                    out.write(record.replace(b'"bench"', rid, 2) + b"\n")
        figures["end-to-end"], figures["end-to-end cpu"] = [], []
        for _ in range(ROUNDS):
            processor = load_processor(settings)
            with open(os.devnull, "wb") as sink:
                start, cpu = time.perf_counter(), time.process_time()
                replay_file(str(path), processor, out=sink, err=io.StringIO())
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            count = END_TO_END_ANSWERS * len(records)
            figures["end-to-end"].append(_us_per(elapsed, count))
            figures["end-to-end cpu"].append(_us_per(cpu, count))
    return {k: statistics.median(v) for k, v in figures.items()}


def main(argv: list[str]) -> None:
    models = argv or list(MODEL_PROMPTS)
    print(
        f"derender core, {TOKENS}-token answer in 1-token records, median of {ROUNDS} rounds (µs per record)"
    )
    header = f"{'tokenizer':<18}{'parse':>9}{'derender':>10}{'serialize':>11}{'total':>9}{'floor':>8}"
    long_prompts = "".join(f"{f'@{n:,}':>9}" for n in LONG_PROMPTS)
    print(header + f"{'vs vLLM':>9}{'end-to-end':>12}{'vs vLLM':>9}{'(CPU)':>8}{long_prompts}")
    for model in models:
        f = bench_model(model)
        print(
            f"{model:<18}{f['parse']:>9.1f}{f['derender']:>10.1f}{f['serialize']:>11.1f}"
            f"{f['total']:>9.1f}{f['floor']:>8.2f}{VLLM_US_PER_CHUNK / f['total']:>8.1f}x"
            f"{f['end-to-end']:>12.1f}{VLLM_US_PER_CHUNK / f['end-to-end']:>8.1f}x{f['end-to-end cpu']:>8.1f}"
            + "".join(f"{f[f'later @{n}']:>9.1f}" for n in LONG_PROMPTS)
        )
    print(
        f"vLLM: {VLLM_US_PER_CHUNK:.0f} µs per 1-token chunk. "
        "floor: one tokenizers.decode of all ids, per token.\n"
        f"end-to-end: replay after start-up, {END_TO_END_ANSWERS * TOKENS:,} records, GC on "
        "((CPU): this process's CPU time, what neighbours on a shared machine do not inflate). "
        "target: end-to-end <= 27 µs (10x vLLM).\n"
        f"@N: the processor's cost per later 1-token record ({LATER_RECORDS} of them) of a request "
        "whose first record brought an N-token prompt (target: as total, whatever N)."
    )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
