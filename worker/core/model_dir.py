"""Load a model directory the way vLLM's derender sees it.

Only four files matter: ``tokenizer.json`` (optionally ``tokenizer.json.xz``),
``tokenizer_config.json``, ``config.json`` (``model_type``,
``max_position_embeddings``) and ``generation_config.json`` (EOS ids).
Tokenizer metadata (special tokens, EOS, added vocabulary) is what vLLM's own
transformers tokenizer reports. ``tokenizers`` reads the folder directly where
transformers would load the same thing (every bundled tokenizer; a test holds
the two equal); transformers, slow to import, is imported only for the rest.
The per-token work runs on the Rust ``tokenizers`` object either way.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer

from worker.errors import ConfigurationError

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")


@dataclass(frozen=True, slots=True)
class LoadedTokenizer:
    """A tokenizer plus the metadata derender needs, resolved once."""

    backend: Tokenizer
    vocab_size: int
    """``len(tokenizer)``: the full vocabulary including added tokens."""
    special_ids: frozenset[int]
    """Ids that ``skip_special_tokens`` drops (transformers' ``all_special_ids``)."""
    added_vocab: dict[str, int]
    eos_token_id: int | None
    """The tokenizer's own EOS: dropped with ``stop_reason`` left null."""
    model_eos_ids: frozenset[int]
    """Every EOS the engine stops on (tokenizer EOS plus ``generation_config``)."""
    leading_space_marker: str | None
    """Metaspace replacement character, when the pre-tokenizer has one."""
    clean_up_tokenization_spaces: bool
    model_type: str | None
    max_position_embeddings: int | None
    chat_template: str | None
    loaded_with: Literal["tokenizers", "transformers"]
    """Which library read the folder (``load_tokenizer`` says when each is used)."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path.name} must hold a JSON object")
    return data


def unpacked_model_dir(model_dir: Path) -> Path:
    """Return a directory with a plain ``tokenizer.json``.

    A bundled folder stores it as ``tokenizer.json.xz``; both loaders read the
    plain file, so it is unpacked once into a cache keyed by content hash.
    """
    if (model_dir / "tokenizer.json").exists():
        return model_dir
    packed = model_dir / "tokenizer.json.xz"
    if not packed.exists():
        raise ConfigurationError(f"{model_dir} has neither tokenizer.json nor tokenizer.json.xz")
    raw = packed.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()[:16]
    cache_root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "derender-worker"
    target = cache_root / f"{model_dir.name}-{digest}"
    if (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))
    for name in _TOKENIZER_FILES[1:]:
        if (model_dir / name).exists():
            shutil.copy2(model_dir / name, staging / name)
    (staging / "tokenizer.json").write_bytes(lzma.decompress(raw))
    try:
        staging.rename(target)
    except OSError:  # another process won the race: use its copy
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _component_spec(component: Any) -> dict[str, Any]:
    """A pre-tokenizer's or decoder's own JSON (not the whole tokenizer's, which holds the vocabulary)."""
    if component is None:
        return {}
    spec = json.loads(component.__getstate__())
    return spec if isinstance(spec, dict) else {}


def _model_spec(model: Any) -> dict[str, Any]:
    """The model's type and decoding flags, read as attributes (its JSON would hold the vocabulary)."""
    spec: dict[str, Any] = {"type": type(model).__name__}
    for name in ("byte_fallback", "fuse_unk", "continuing_subword_prefix", "end_of_word_suffix"):
        if hasattr(model, name):
            spec[name] = getattr(model, name)
    return spec


def _leading_space_marker(backend: Tokenizer) -> str | None:
    pre = _component_spec(backend.pre_tokenizer)
    candidates = [pre] if pre.get("type") != "Sequence" else pre.get("pretokenizers", [])
    for sub in candidates:
        if sub.get("type") == "Metaspace":
            marker = sub.get("replacement", "\u2581")
            return marker if isinstance(marker, str) else None
    return None


def _eos_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    raise ConfigurationError(f"eos_token_id must be an int or a list of ints, got {value!r}")


# transformers' named special-token attributes (``SPECIAL_TOKENS_ATTRIBUTES``).
_NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

# Files through which transformers can change the vocabulary or the special tokens beyond
# ``tokenizer.json`` + ``tokenizer_config.json``: with any of them present, it loads the folder.
_TRANSFORMERS_ONLY_FILES = ("special_tokens_map.json", "added_tokens.json", "tokenizer_config.py")

_SENTENCEPIECE_BPE_DECODER = [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"},
    {"type": "Fuse"},
]
_LEADING_SPACE_STRIP = {"type": "Strip", "content": " ", "start": 1, "stop": 0}


@dataclass(frozen=True, slots=True)
class _TokenizerClass:
    """What transformers' tokenizer class does to a folder's ``tokenizer.json`` when it loads it."""

    defaults: dict[str, str]
    """Named special tokens the class sets when ``tokenizer_config.json`` does not name them."""
    keeps_decoding: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], bool]
    """Whether the backend it builds decodes as ``tokenizer.json`` does (model, decoder, config)."""


def _as_loaded(model: dict[str, Any], decoder: dict[str, Any], config: dict[str, Any]) -> bool:
    return True  # the generic class uses tokenizer.json's pipeline as it is


def _llama_rebuild_keeps(model: dict[str, Any], decoder: dict[str, Any], config: dict[str, Any]) -> bool:
    # transformers 5's LlamaTokenizer rebuilds a byte-fallback BPE with the SentencePiece decoder,
    # a leading-space Strip unless add_prefix_space is false.
    strip = [_LEADING_SPACE_STRIP] if config.get("add_prefix_space", True) is not False else []
    return (
        model.get("type") == "BPE"
        and model.get("byte_fallback") is True
        and model.get("fuse_unk") is True
        and decoder == {"type": "Sequence", "decoders": [*_SENTENCEPIECE_BPE_DECODER, *strip]}
    )


def _qwen2_rebuild_keeps(model: dict[str, Any], decoder: dict[str, Any], config: dict[str, Any]) -> bool:
    # transformers 5's Qwen2Tokenizer rebuilds a plain BPE with a ByteLevel decoder, whose
    # flags only affect offsets, not text.
    return (
        model.get("type") == "BPE"
        and not model.get("byte_fallback")
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
        and decoder.get("type") == "ByteLevel"
    )


# The classes whose loading is reproduced here, each checked against transformers on every
# bundled tokenizer (tests/core/test_tokenizer_loading.py). Any other class goes through transformers.
_KNOWN_CLASSES: dict[str, _TokenizerClass] = {
    "PreTrainedTokenizerFast": _TokenizerClass({}, _as_loaded),
    "TokenizersBackend": _TokenizerClass({}, _as_loaded),
    "LlamaTokenizerFast": _TokenizerClass({}, _as_loaded),
    "LlamaTokenizer": _TokenizerClass(
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}, _llama_rebuild_keeps
    ),
    "Qwen2Tokenizer": _TokenizerClass(
        {"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        _qwen2_rebuild_keeps,
    ),
}


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an ``AddedToken`` object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        content: str = value["content"]
        return content
    return None


def _special_token_texts(config: dict[str, Any], defaults: dict[str, str]) -> list[str] | None:
    """``all_special_tokens`` as transformers resolves them, or None for a form not reproduced here."""
    texts: list[str] = []
    for name in _NAMED_SPECIAL_TOKENS:
        value = config[name] if name in config else defaults.get(name)
        if value is None:
            continue
        text = _token_text(value)
        if text is None:
            return None
        texts.append(text)
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config.get(key)
        if extra is None or extra == {}:  # an empty dict names no attribute (gpt-oss writes one)
            continue
        if not isinstance(extra, list):  # a dict names model-specific attributes: transformers' own logic
            return None
        for value in extra:
            text = _token_text(value)
            if text is None:
                return None
            texts.append(text)
    return texts


def _added_tokens_agree(backend: Tokenizer, config: dict[str, Any]) -> bool:
    """Whether ``added_tokens_decoder`` adds or re-flags nothing that ``tokenizer.json`` lacks."""
    declared = config.get("added_tokens_decoder")
    if declared is None:
        return True
    if not isinstance(declared, dict):
        return False
    present = backend.get_added_tokens_decoder()
    for key, value in declared.items():
        if not (isinstance(key, str) and key.isdigit() and isinstance(value, dict)):
            return False
        token = present.get(int(key))
        if token is None or token.content != value.get("content"):
            return False
        if bool(value.get("special", False)) != token.special:
            return False
    return True


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    jinja = folder / "chat_template.jinja"
    return jinja.read_text(encoding="utf-8") if jinja.exists() else None


def _direct_load(folder: Path, config: dict[str, Any]) -> LoadedTokenizer | None:
    """Load with ``tokenizers`` alone, or None where transformers would load it differently.

    What transformers' fast tokenizer adds over ``tokenizers.Tokenizer`` for derender, and how it
    is reproduced: ``len(tokenizer)`` is the vocabulary with added tokens; ``all_special_ids`` are
    the named special tokens (config, else the class's defaults) plus the extra ones, looked up in
    the vocabulary; ``decode`` and ``convert_ids_to_tokens`` call the same backend, then apply
    ``clean_up_tokenization_spaces`` (which ``TextDecoder`` mirrors); the class may rebuild the
    backend (LlamaTokenizer, Qwen2Tokenizer), so a class is only taken where the rebuilt backend
    provably decodes the same, and tokens that ``tokenizer_config.json`` would add or re-flag send
    the folder to transformers.
    """
    if any((folder / name).exists() for name in _TRANSFORMERS_ONLY_FILES) or "auto_map" in config:
        return None
    known = _KNOWN_CLASSES.get(str(config.get("tokenizer_class", "PreTrainedTokenizerFast")))
    clean_up = config.get("clean_up_tokenization_spaces", False)
    if known is None or not isinstance(clean_up, bool):
        return None
    try:
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception:  # noqa: BLE001  # whatever it is, transformers either reads the file or says why
        return None
    if not known.keeps_decoding(_model_spec(backend.model), _component_spec(backend.decoder), config):
        return None
    if not _added_tokens_agree(backend, config):
        return None
    texts = _special_token_texts(config, known.defaults)
    if texts is None:
        return None
    special_ids: set[int] = set()
    for text in texts:
        token_id = backend.token_to_id(text)
        if token_id is None:  # transformers would add it as a new token
            return None
        special_ids.add(token_id)
    eos_text = _token_text(config["eos_token"] if "eos_token" in config else known.defaults.get("eos_token"))
    return _assemble(
        folder,
        backend,
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
        special_ids=frozenset(special_ids),
        eos_token_id=backend.token_to_id(eos_text) if eos_text is not None else None,
        clean_up=clean_up,
        chat_template=_chat_template(folder, config),
        loaded_with="tokenizers",
    )


def _transformers_load(folder: Path, source: Path) -> LoadedTokenizer:
    """Load through transformers' ``AutoTokenizer``: what vLLM does, for folders not reproduced here."""
    # Imported only here: transformers' import alone takes longer than reading a tokenizer.
    # Its advisory warnings (no PyTorch, tokenizer class hints) are noise for a tokenizer-only user.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise ConfigurationError(f"cannot load tokenizer from {source}: {exc}") from exc
    backend = getattr(hf, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise ConfigurationError(f"{source}: only fast (tokenizers-backed) tokenizers are supported")
    template = getattr(hf, "chat_template", None)
    return _assemble(
        folder,
        backend,
        vocab_size=len(hf),
        special_ids=frozenset(int(i) for i in hf.all_special_ids if i is not None),
        eos_token_id=hf.eos_token_id if isinstance(hf.eos_token_id, int) else None,
        clean_up=bool(getattr(hf, "clean_up_tokenization_spaces", False)),
        chat_template=template if isinstance(template, str) else None,
        loaded_with="transformers",
    )


def _assemble(
    folder: Path,
    backend: Tokenizer,
    *,
    vocab_size: int,
    special_ids: frozenset[int],
    eos_token_id: int | None,
    clean_up: bool,
    chat_template: str | None,
    loaded_with: Literal["tokenizers", "transformers"],
) -> LoadedTokenizer:
    config = _read_json(folder / "config.json")
    generation = _read_json(folder / "generation_config.json")
    model_eos = set(_eos_ids(generation.get("eos_token_id")))
    if eos_token_id is not None:
        model_eos.add(eos_token_id)
    max_pos = config.get("max_position_embeddings")
    return LoadedTokenizer(
        backend=backend,
        vocab_size=vocab_size,
        special_ids=special_ids,
        added_vocab={token.content: i for i, token in backend.get_added_tokens_decoder().items()},
        eos_token_id=eos_token_id,
        model_eos_ids=frozenset(model_eos),
        leading_space_marker=_leading_space_marker(backend),
        clean_up_tokenization_spaces=clean_up,
        model_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        max_position_embeddings=max_pos if isinstance(max_pos, int) else None,
        chat_template=chat_template,
        loaded_with=loaded_with,
    )


def load_tokenizer(model_dir: str | os.PathLike[str], *, via_transformers: bool = False) -> LoadedTokenizer:
    """Load ``model_dir``; raise ``ConfigurationError`` with the reason if it cannot be used.

    ``tokenizers`` reads the folder directly wherever that is provably what transformers would
    load (see ``_direct_load``); otherwise, or with ``via_transformers``, transformers loads it.
    """
    source = Path(model_dir)
    if not source.is_dir():
        raise ConfigurationError(f"tokenizer directory {source} does not exist")
    folder = unpacked_model_dir(source)
    if not via_transformers:
        loaded = _direct_load(folder, _read_json(folder / "tokenizer_config.json"))
        if loaded is not None:
            return loaded
    return _transformers_load(folder, source)
