"""The Kafka runtime: ``derender-worker topics create`` and ``derender-worker run``.

One ``run`` process is one member of a consumer group. For every input partition it
owns, it holds one ``EnvelopeProcessor`` (all sharing one ``Derenderer``), one sink
(a transactional producer in exactly-once mode) and the partition's slice of the
compacted state topic, restored before the partition's first record is processed.
Scaling out is starting more processes with the same ``--group-id`` (up to one per
input partition); Kafka's group protocol moves partitions, the state topic moves state.

Topics (``topics create`` makes all four, idempotently):

* input  -- envelopes keyed by ``request_id`` (so one request stays in one partition)
* output -- output envelopes keyed by ``request_id``, ``source`` = input position
* state  -- compacted checkpoints of open requests; **same partition count as the input**:
            state partition ``p`` holds the open requests of input partition ``p``
* dead letters -- ``DeadLetterRecord`` JSON for records that are not envelopes

Exactly-once, checkpoints and restores: docs/kafka-worker.md, docs/exactly-once.md, docs/state.md,
and ``state.changelog``.

The loop's modules sit here, in the order a record meets them: ``topics``, ``lifecycle``,
``records``, ``delivery`` (exactly-once and at-least-once sinks), ``partition``, ``memory``,
``commit_schedule`` / ``committer``, ``assignment`` / ``partition_opener``, ``worker`` (the poll /
process / commit loop); ``composition`` builds them from the settings. Beside them, one package per
concern:

* ``kafka_client``   -- the only code that touches a Kafka library: protocols (``base``), the two
                        backends, the group-less range reader (``ranges``), limits
* ``state``          -- the state topic: ``changelog`` (its one owner), ``store`` (reading it)
* ``dead_letters``   -- the dead-letter record, the per-partition breaker, poison bounds, ``dlq replay``
* ``observability``  -- metrics, ``/metrics`` and probes, traces, structured logs
* ``security``       -- TLS / SASL options and OAUTHBEARER token providers
"""
