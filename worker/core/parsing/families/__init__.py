"""One module per vLLM parser-engine family: markers, config, argument converter and scanner, hooks.

Each module defines its family once (an :class:`~worker.core.parsing.engine.family.EngineFamily`)
and derives both adapters from it; :mod:`worker.core.parsing.registry` names the adapters.
"""
