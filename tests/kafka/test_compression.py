"""``--compression-type`` against a real broker: a worker of each backend writes compressed batches
whose records read back exactly as ``replay`` makes them."""

from __future__ import annotations

import pytest

from tests.async_helpers import run_bounded
from tests.golden_cases import derenderer_for
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import (
    QWEN3_CONFIG,
    TopicReader,
    WorkerGroup,
    assert_identical,
    fetched_bytes,
    generate_sequences,
    interleave,
    make_worker_topics,
    produce,
    replay,
)

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize(("client", "codec"), [("aiokafka", "lz4"), ("confluent", "zstd")])
def test_compressed_outputs_round_trip(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, client: str, codec: str
) -> None:
    records = interleave(generate_sequences(40, seed=29, prefix=f"z-{codec}"), window=20)
    reference = replay(derenderer_for(QWEN3_CONFIG), records)
    topics = make_worker_topics(kafka_topic_factory, partitions=2)
    group = WorkerGroup(
        kafka_bootstrap, topics, QWEN3_CONFIG, client=client, extra=["--compression-type", codec]
    )

    async def body() -> None:
        await produce(kafka_bootstrap, topics.input, records)
        reader = await TopicReader(kafka_bootstrap, topics.output).start()
        worker = group.start()
        try:
            await reader.wait_for(reference.output_count, 90, "outputs", group.logs)
            await reader.settle(1.0)
        finally:
            status = worker.terminate()
            await reader.stop()
        assert status == 0, group.logs()
        assert_identical(reader.records, reference, group.logs())

    run_bounded(body(), 180)
    wire, payload = fetched_bytes(kafka_bootstrap, topics.output, reference.output_count)
    # Uncompressed batches cost more than their records (framing); these JSON outputs compress
    # several-fold, so well under the records' own size means the batches were compressed.
    assert wire < payload * 0.6, f"{wire} bytes fetched for {payload} bytes of records: not compressed"
