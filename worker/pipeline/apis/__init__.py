"""The other APIs the gateway speaks, each turned into a chat request and back.

Every API here converts its request into a chat completions request as vLLM 0.33.0's renderer does, sends it
through the gateway's chat path (so the Kafka topics carry chat envelopes and the worker, replay and audit
are unchanged), and turns the chat deltas into its own events:

* ``messages``: Anthropic Messages (``POST /v1/messages``).
* ``responses``: OpenAI Responses (``POST /v1/responses``), ``responses_store`` its stored responses,
  ``background`` its background responses.
* ``batch``: OpenAI Batch (``/v1/files``, ``/v1/batches``), each input line a chat request;
  ``batch_run`` runs one batch.
* ``lease``: which replica runs a background response or a batch, and how another takes it over;
  ``reattach``: a taken-over request's answer, read back from the topics.
* ``routes``: the HTTP handlers, registered by the gateway.
"""
