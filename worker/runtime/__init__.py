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
and ``state_changelog``.

Modules, in the order a record meets them:

* ``topics``        -- creating and checking the four topics
* ``lifecycle``     -- the worker's state machine (transition table)
* ``kafka_client``  -- the client layer: protocols (``base``), aiokafka and librdkafka backends,
                       the group-less range reader (``ranges``)
* ``state_changelog`` -- the one owner of the state topic: keys, codec, checkpoints, restore
* ``state_store``   -- reading a state partition to its end (and an input range to replay)
* ``records``       -- ``ProcessResult`` -> outgoing Kafka records (output, dead letter)
* ``dead_letter_record`` -- a dead letter with its Kafka key, headers and source, within a limit
* ``delivery``      -- exactly-once (a transactional producer per partition, or one per
                       worker) and at-least-once sinks
* ``partition``     -- one owned input partition: processor + sink + uncommitted work
* ``dead_letter_policy`` -- the per-partition breaker that pauses a partition drowning in
                       dead letters
* ``memory``        -- the caps on open requests and state bytes (a new request past one gets 503)
* ``worker``        -- the poll / process / commit loop, backpressure, pausing, shutdown
* ``composition``   -- the composition root: the derenderer, processors and a worker's parts,
                       built from the settings and passed to constructors
* ``metrics_names`` / ``metrics`` -- metric names (one place) and an in-process registry
* ``prometheus_export`` / ``health_server`` -- ``/metrics``, ``/healthz``, ``/readyz``
* ``kafka_security`` -- TLS / SASL options, passed to every Kafka client
* ``kafka_oauth``   -- OAUTHBEARER tokens: OIDC client credentials, AWS MSK IAM
* ``observer``      -- the per-record observability hook: ``tracing`` (W3C trace context through
                       Kafka, optional OpenTelemetry spans) and ``genai_metrics``
* ``structured_logging`` -- ``--log-format json``
* ``dlq_replay``    -- ``dlq replay``: re-drive dead letters to the input topic after a fix
* ``commands``      -- the ``topics``, ``run`` and ``dlq`` sub-commands
"""
