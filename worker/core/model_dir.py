"""Load a model directory the way vLLM's derender sees it.

Only four files matter: ``tokenizer.json`` (optionally ``tokenizer.json.xz``),
``tokenizer_config.json``, ``config.json`` (``model_type``,
``max_position_embeddings``) and ``generation_config.json`` (EOS ids).
Tokenizer metadata (special tokens, EOS, added vocabulary) comes from
transformers once at load time, so it is what vLLM's own tokenizer reports;
the per-token work then runs on the Rust ``tokenizers`` object directly.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    A bundled folder stores it as ``tokenizer.json.xz``; transformers needs the
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


def _leading_space_marker(backend: Tokenizer) -> str | None:
    config = json.loads(backend.to_str())
    pre = config.get("pre_tokenizer") or {}
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


def load_tokenizer(model_dir: str | os.PathLike[str]) -> LoadedTokenizer:
    """Load ``model_dir``; raise ``ConfigurationError`` with the reason if it cannot be used."""
    source = Path(model_dir)
    if not source.is_dir():
        raise ConfigurationError(f"tokenizer directory {source} does not exist")
    folder = unpacked_model_dir(source)

    # transformers is slow to import; only start-up pays for it. Its advisory
    # warnings (no PyTorch, tokenizer class hints) are noise for a tokenizer-only user.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise ConfigurationError(f"cannot load tokenizer from {source}: {exc}") from exc
    backend = getattr(hf, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise ConfigurationError(f"{source}: only fast (tokenizers-backed) tokenizers are supported")

    config = _read_json(folder / "config.json")
    generation = _read_json(folder / "generation_config.json")
    eos_token_id = hf.eos_token_id if isinstance(hf.eos_token_id, int) else None
    model_eos = set(_eos_ids(generation.get("eos_token_id")))
    if eos_token_id is not None:
        model_eos.add(eos_token_id)
    max_pos = config.get("max_position_embeddings")
    template = getattr(hf, "chat_template", None)
    return LoadedTokenizer(
        backend=backend,
        vocab_size=len(hf),
        special_ids=frozenset(int(i) for i in hf.all_special_ids if i is not None),
        added_vocab=dict(hf.get_added_vocab()),
        eos_token_id=eos_token_id,
        model_eos_ids=frozenset(model_eos),
        leading_space_marker=_leading_space_marker(backend),
        clean_up_tokenization_spaces=bool(getattr(hf, "clean_up_tokenization_spaces", False)),
        model_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        max_position_embeddings=max_pos if isinstance(max_pos, int) else None,
        chat_template=template if isinstance(template, str) else None,
    )
