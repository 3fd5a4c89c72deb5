"""The pure derender core: token ids and state in, OpenAI objects and state out. No I/O.

Nothing is imported here: the settings read the core's leaf modules (``limits``, ``vllm_version``)
without loading the tokenizer or the parsers; import the part you use (``worker.core.derenderer``).
"""
