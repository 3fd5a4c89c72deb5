"""The pure derender core: token ids and state in, OpenAI objects and state out. No I/O."""

from worker.core.derenderer import Derenderer, ServerOptions
from worker.core.envelope_processor import EnvelopeProcessor, ProcessResult, RequestContext
from worker.core.model_dir import LoadedTokenizer, load_tokenizer

__all__ = [
    "Derenderer",
    "EnvelopeProcessor",
    "LoadedTokenizer",
    "ProcessResult",
    "RequestContext",
    "ServerOptions",
    "load_tokenizer",
]
