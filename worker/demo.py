"""``derender-worker demo``: derender a bundled recorded stream and show the result.

Offline: the bundled sample stream (real Qwen3 token ids) goes through the same
core as the Kafka worker, printing every OpenAI chunk and then each assembled
response.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from worker.assembly import Assembler, render_text
from worker.settings import ModelSettings

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
DEMO_STREAM = SAMPLES / "streams" / "demo-qwen3.jsonl"
DEMO_MODEL_NAME = "qwen3-demo"


def run_offline_demo(args: argparse.Namespace) -> int:
    stream = Path(args.stream) if args.stream else DEMO_STREAM
    model_dir = args.tokenizer or str(SAMPLES / "models" / "qwen3")
    settings = ModelSettings(
        tokenizer=model_dir,
        served_model_names=(DEMO_MODEL_NAME,),
        reasoning_parser="qwen3",
        tool_parser="hermes",
        enable_auto_tool_choice=True,
    )
    processor = settings.build_processor()
    assembler = Assembler()
    out = sys.stdout
    out.write(f"derendering {stream.name} with the tokenizer in {Path(model_dir).name}/\n\n")
    for line in stream.read_bytes().splitlines():
        if not line.strip():
            continue
        result = processor.process(line)
        if result.output is None:
            reason = result.dead_letter.reason if result.dead_letter else "duplicate"
            out.write(f"skipped: {reason}\n")
            continue
        assembler.add(result.output)
        body = result.output.get("body")
        shown = body["chunk"] if body and "chunk" in body else (body or result.output.get("error"))
        out.write(orjson.dumps(shown).decode() + "\n")
    out.write("\nassembled responses:\n")
    for response in assembler.responses.values():
        out.write(render_text(response) + "\n")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo", help="derender a bundled recorded stream and show the responses")
    demo.add_argument("--stream", help="input envelopes (default: the bundled Qwen3 sample)")
    demo.add_argument("--tokenizer", help="model directory (default: the bundled Qwen3 tokenizer)")
    demo.add_argument("--offline", action="store_true", help="derender in-process, without Kafka")
    demo.set_defaults(handler=run_offline_demo)
