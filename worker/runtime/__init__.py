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
* state  -- compacted, keyed by ``request_id``; **same partition count as the input**:
            state partition ``p`` holds the open requests of input partition ``p``
* dead letters -- ``DeadLetterRecord`` JSON for records that are not envelopes

Exactly-once, per commit interval and input partition, one transaction holds the
outputs, dead letters, state snapshots and the input offset. Zombies are fenced by a
stable ``transactional_id`` per input partition (aiokafka has no KIP-447). Readers of the
output topic must use ``isolation_level=read_committed``. At-least-once drops the
transactions: a crash or a failed commit re-delivers outputs (duplicates, never loss);
outputs are visible at once (lower latency) and a lagging zombie can write too.

Modules, in the order a record meets them:

* ``config``        -- flags / environment variables, ``KafkaSettings``
* ``topics``        -- creating and checking the four topics
* ``lifecycle``     -- the worker's state machine (transition table)
* ``rebalance``     -- the consumer-group listener: commit on revoke, open on assign
* ``state_store``   -- snapshot encoding and restoring a partition from the state topic
* ``records``       -- ``ProcessResult`` -> outgoing Kafka records (output, dead letter)
* ``delivery``      -- exactly-once (one transactional producer per partition) and
                       at-least-once sinks
* ``partition``     -- one owned input partition: processor + sink + uncommitted work
* ``dead_letter_policy`` -- the per-partition breaker that pauses a partition drowning in
                       dead letters
* ``memory``        -- the caps on open requests and state bytes (a new request past one gets 503)
* ``worker``        -- the poll / process / commit loop, backpressure, pausing, shutdown
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
