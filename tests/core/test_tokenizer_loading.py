"""Loading a tokenizer folder with ``tokenizers`` alone decodes exactly as transformers does.

vLLM decodes through transformers' fast tokenizer. The worker reads ``tokenizer.json`` with
``tokenizers`` directly where that loads the same thing, so start-up does not import
transformers; these tests hold the two equal on every tokenizer the repository carries
(metadata, whole-sequence decode, ``convert_ids_to_tokens``, the incremental window with special
tokens skipped, logprob strings) and check that folders the direct path cannot reproduce go
through transformers.
"""

from __future__ import annotations

import json
import os
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.golden_cases import MODELS_DIR
from worker.core.decoding import TextDecoder
from worker.core.model_dir import LoadedTokenizer, load_tokenizer, unpacked_model_dir

MODEL_NAMES = sorted(p.name for p in MODELS_DIR.iterdir() if (p / "tokenizer_config.json").exists())


@cache
def _hf(folder: Path) -> Any:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@cache
def _loaded(model: str, via_transformers: bool) -> LoadedTokenizer:
    return load_tokenizer(MODELS_DIR / model, via_transformers=via_transformers)


def _ids(model: str) -> st.SearchStrategy[list[int]]:
    """Any id of the vocabulary, with added/special tokens and byte pieces drawn often."""
    loaded = _loaded(model, False)
    notable = sorted(set(loaded.added_vocab.values()) | loaded.special_ids)
    byte_pieces = (loaded.backend.token_to_id(f"<0x{b:02X}>") for b in (0x20, 0xE2, 0x82, 0xAC))
    notable += [i for i in byte_pieces if i is not None]
    one = st.one_of(st.integers(0, loaded.vocab_size - 1), st.sampled_from(notable))
    return st.lists(one, max_size=24)


def test_every_bundled_tokenizer_loads_without_transformers() -> None:
    assert MODEL_NAMES  # the parametrized tests below cover exactly these
    for model in MODEL_NAMES:
        assert _loaded(model, False).loaded_with == "tokenizers", model
        assert _loaded(model, True).loaded_with == "transformers", model


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_metadata_equals_transformers(model: str) -> None:
    direct, via = _loaded(model, False), _loaded(model, True)
    hf = _hf(unpacked_model_dir(MODELS_DIR / model))
    assert direct.vocab_size == via.vocab_size == len(hf)
    assert direct.special_ids == via.special_ids == frozenset(hf.all_special_ids)
    assert direct.eos_token_id == via.eos_token_id == hf.eos_token_id
    assert direct.added_vocab == via.added_vocab == hf.get_added_vocab()
    for name in (
        "model_eos_ids",
        "leading_space_marker",
        "clean_up_tokenization_spaces",
        "model_type",
        "max_position_embeddings",
        "chat_template",
    ):
        assert getattr(direct, name) == getattr(via, name), name
    assert direct.clean_up_tokenization_spaces == hf.clean_up_tokenization_spaces


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_decoding_equals_transformers(model: str) -> None:
    direct, via = _loaded(model, False), _loaded(model, True)
    hf = _hf(unpacked_model_dir(MODELS_DIR / model))
    ours, theirs = TextDecoder(direct), TextDecoder(via)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ids=_ids(model), skip=st.booleans())
    def check(ids: list[int], skip: bool) -> None:
        assert ours.decode(ids) == hf.decode(ids)
        assert direct.backend.decode(ids, skip_special_tokens=skip) == hf.backend_tokenizer.decode(
            ids, skip_special_tokens=skip
        )
        assert [direct.backend.id_to_token(i) for i in ids] == hf.convert_ids_to_tokens(ids)
        assert ours.token_strings(ids) == theirs.token_strings(ids)
        mine, other = ours.seed_window(ids[:7], skip), theirs.seed_window(ids[:7], skip)
        assert mine == other
        for token_id in ids:
            assert ours.extend(mine, [token_id], skip) == theirs.extend(other, [token_id], skip)
        assert mine == other

    check()


# -- folders the direct path does not reproduce go through transformers ------------------------


def _copy_folder(model: str, tmp_path: Path) -> Path:
    target = tmp_path / model
    shutil.copytree(unpacked_model_dir(MODELS_DIR / model), target)
    return target


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(config | changes), encoding="utf-8")


def _assert_decodes_like_transformers(loaded: LoadedTokenizer, folder: Path, ids: list[int]) -> None:
    hf = _hf(folder)
    assert loaded.special_ids == frozenset(hf.all_special_ids)
    assert loaded.vocab_size == len(hf)
    assert TextDecoder(loaded).decode(ids) == hf.decode(ids)


def test_a_llama_rebuild_without_the_leading_space_strip_goes_through_transformers(tmp_path: Path) -> None:
    # transformers 5's LlamaTokenizer rebuilds the decoder from the config: with add_prefix_space
    # false it has no Strip, so tokenizer.json's own decoder would keep a leading space it drops.
    folder = _copy_folder("mistral-7b-v0.1", tmp_path)
    _edit_config(folder, add_prefix_space=False)
    loaded = load_tokenizer(folder)
    assert loaded.loaded_with == "transformers"
    hello = loaded.backend.token_to_id("▁Hello")
    assert hello is not None
    _assert_decodes_like_transformers(loaded, folder, [hello, hello])


def test_special_tokens_map_json_goes_through_transformers(tmp_path: Path) -> None:
    folder = _copy_folder("qwen3", tmp_path)
    special_map = json.dumps({"unk_token": "<|fim_pad|>"})
    (folder / "special_tokens_map.json").write_text(special_map, encoding="utf-8")
    loaded = load_tokenizer(folder)
    assert loaded.loaded_with == "transformers"
    _assert_decodes_like_transformers(loaded, folder, [151662, 9707])


def test_a_special_token_missing_from_the_vocabulary_goes_through_transformers(tmp_path: Path) -> None:
    folder = _copy_folder("mistral-7b-v0.3", tmp_path)
    _edit_config(folder, additional_special_tokens=["<brand_new_token>"])
    loaded = load_tokenizer(folder)
    assert loaded.loaded_with == "transformers"
    _assert_decodes_like_transformers(loaded, folder, [1, 22557])


def test_an_unknown_tokenizer_class_goes_through_transformers(tmp_path: Path) -> None:
    folder = _copy_folder("llama-3", tmp_path)
    _edit_config(folder, tokenizer_class="GPT2Tokenizer")
    loaded = load_tokenizer(folder)
    assert loaded.loaded_with == "transformers"
    _assert_decodes_like_transformers(loaded, folder, [128000, 9906, 11, 1917, 0, 128009])


def test_an_added_token_re_flagged_by_the_config_goes_through_transformers(tmp_path: Path) -> None:
    folder = _copy_folder("qwen3", tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    decoder = dict(config["added_tokens_decoder"])
    decoder["151657"] = {**decoder["151657"], "special": not decoder["151657"]["special"]}
    _edit_config(folder, added_tokens_decoder=decoder)
    loaded = load_tokenizer(folder)
    assert loaded.loaded_with == "transformers"
    _assert_decodes_like_transformers(loaded, folder, [151657, 9707])
