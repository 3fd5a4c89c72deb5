"""Both ends of the pipeline around the worker.

* ``produce`` / ``consume`` (``records.py``): JSON Lines in and out of any topic, read_committed.
* ``ingest`` (``ingest.py``): OpenAI requests from the requests topic -> vLLM render + generate ->
  input envelopes for the worker.
* ``gateway`` (``gateway.py``): an OpenAI-compatible HTTP server that writes requests to the requests
  topic and serves the worker's output records.

The worker itself (``worker.runtime``) knows nothing of these commands.
"""
