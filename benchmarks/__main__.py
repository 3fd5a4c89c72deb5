"""``python -m benchmarks [name]``: run one benchmark, or all of them."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "core": "benchmarks.derender_core",
    "parsers": "benchmarks.parser_paths",
    "kafka": "benchmarks.kafka_throughput",
    "audit": "benchmarks.audit",
    "pipeline": "benchmarks.pipeline",
    "adversarial": "benchmarks.adversarial",
    "flood": "benchmarks.flood",
    "state": "benchmarks.state_checkpoints",
    "latency": "benchmarks.latency",
}


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "all"
    names = list(BENCHMARKS) if name == "all" else [name]
    for item in names:
        if item not in BENCHMARKS:
            print(f"unknown benchmark {item!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
        try:
            module = importlib.import_module(BENCHMARKS[item])
        except ModuleNotFoundError as exc:
            print(f"benchmark {item!r} is not available: {exc}", file=sys.stderr)
            continue
        module.main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
