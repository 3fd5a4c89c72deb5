"""vLLM's parser engine, once: every engine family is a config over these parts.

``scanner`` (token-id markers) → ``lexer`` (text markers, partial ones held
back) → ``machine`` (the transition table of :class:`~.config.EngineConfig`:
states and events) → an adapter: ``reasoning`` (reasoning/content split) or
``tools`` (tool-call deltas, with ``arguments`` converting a call's raw text to
its JSON and ``shaping`` holding content and reasoning whitespace as vLLM
does). Families (``families/qwen3.py``, ``families/kimi_k2.py``, ...) each
define an :class:`~.family.EngineFamily` (config, argument converter and
scanner) and derive both adapters from it, plus, where vLLM's own class
overrides its engine, a documented hook.
"""
