"""The pure derender core: token ids and state in, OpenAI objects and state out. No I/O."""

from worker.core.derenderer import Derenderer, ServerOptions
from worker.core.envelope_processor import EnvelopeProcessor, ProcessResult
from worker.core.model_dir import LoadedTokenizer, load_tokenizer
from worker.core.request_context import RequestContext

__all__ = [
    "Derenderer",
    "EnvelopeProcessor",
    "LoadedTokenizer",
    "ProcessResult",
    "RequestContext",
    "ServerOptions",
    "load_tokenizer",
]
