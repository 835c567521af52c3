"""Text <-> token ids, the chat template and the stop token ids of a model.

``Tokenizer`` wraps a transformers *fast* tokenizer (the Rust ``tokenizers`` backend) loaded
from an HF-format folder or from a GGUF file's metadata. Converting a GGUF vocabulary through
transformers is slow (seconds), so with ``cache_dir`` the converted tokenizer is saved once
under ``cache_dir/gguf-tokenizers/<key>`` and loaded from there afterwards.

``decode`` is the backend's raw decode: transformers' ``clean_up_tokenization_spaces`` is never
applied, so model output is shown exactly and ``IncrementalDetokenizer`` can match it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from localchat.engine.errors import ModelLoadError, ModelNotFoundError
from localchat.engine.tokenizer_files import TokenizerFiles, compact_tokenizer_json

# Used when a model ships no chat template: plain ChatML (SmolLM2, Qwen and many fine-tunes).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Markers that end an assistant turn in common templates; matched after a rendered reply.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>", "<end_of_turn>",
    "<|end_of_text|>", "<|eom_id|>", "<|END_OF_TURN_TOKEN|>",
)

_SENTINEL = "Lc7Sentinel"


# Tokenizers read from the GGUF tokenizer cache in this process, by cache folder (the folder
# name hashes the file, so a changed file gets a new entry).
_CACHED: dict[Path, Tokenizer] = {}


class SystemPromptFoldedWarning(UserWarning):
    """The chat template rejects the system role; the system text went into the first user
    turn instead (``system + "\n\n" + user``). The CLI prints it as ``localchat: note:``."""


class Tokenizer:
    """A model's tokenizer: ``encode``/``decode``, chat template, stop token ids.

    Build it with ``Tokenizer.from_pretrained``; ``Tokenizer(hf)`` wraps an already loaded
    transformers fast tokenizer (``extra_eos_ids``: more EOS ids, e.g. from a generation config).

    Attributes:
        hf: the underlying transformers fast tokenizer, or on a cached GGUF load a
            ``TokenizerFiles`` (the same interface read with ``tokenizers`` alone).
        loaded_from_cache: ``True`` when it was read from the GGUF tokenizer cache.
    """

    def __init__(self, hf: Any, *, extra_eos_ids: tuple[int, ...] = (),
                 loaded_from_cache: bool = False) -> None:
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise ModelLoadError(f"tokenizer {type(hf).__name__} is not a fast tokenizer")
        self.hf = hf
        self.backend = backend
        self.loaded_from_cache = loaded_from_cache
        self._uses_fallback_template = not getattr(hf, "chat_template", None)
        self._system_role_ok: bool | None = None  # learned on the first system message
        self.special_ids: frozenset[int] = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        ) | frozenset(hf.all_special_ids)
        self.stop_token_ids: frozenset[int] = self._find_stop_ids(extra_eos_ids)
        self._bos_added = self._adds_bos()

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: Path, *, cache_dir: Path | None = None) -> Tokenizer:
        """Load from an HF-format folder or a ``.gguf`` file (never remote code).

        For a GGUF file with ``cache_dir``, the converted tokenizer is cached under
        ``cache_dir/gguf-tokenizers/<key>`` (``loader.gguf.gguf_cache_key``: file name, size,
        a hash of its first and last MiB, and the transformers version), written atomically,
        its ``tokenizer.json`` compacted (``tokenizer_files.compact_tokenizer_json``: ~20%
        less parse time). transformers converts it on the first load only: a cached load reads the folder with
        the ``tokenizers`` library (``tokenizer_files.TokenizerFiles``) and renders the chat
        template with ``engine.chat_template`` (transformers' renderer, rebuilt on jinja2),
        so it imports no transformers code. A damaged cache entry is rebuilt.

        Raises:
            ModelNotFoundError: ``path`` does not exist.
            ModelLoadError: the tokenizer files or GGUF metadata are unreadable or corrupt.
        """
        path = Path(path)
        if not path.exists():
            raise ModelNotFoundError(f"no tokenizer at {path}: no such file or folder")
        if path.is_dir():
            hf = _load_hf(path)
            return cls(hf, extra_eos_ids=_generation_config_eos(path))
        if cache_dir is None:
            return cls(_load_gguf(path))
        from localchat.engine.cache_keys import gguf_cache_key

        target = Path(cache_dir) / "gguf-tokenizers" / gguf_cache_key(path)
        if target in _CACHED:  # the pre-load prompt check and the load read it once
            return _CACHED[target]
        if target.is_dir():
            try:  # an entry saved before compact_tokenizer_json: compacted once, here
                compact_tokenizer_json(target / "tokenizer.json")
            except (OSError, ValueError):
                pass  # read-only cache, or damaged (TokenizerFiles says so below)
            try:
                tokenizer = cls(TokenizerFiles(target), loaded_from_cache=True)
            except ModelLoadError:
                shutil.rmtree(target, ignore_errors=True)  # a damaged cache entry: rebuild it
            else:
                _CACHED[target] = tokenizer
                return tokenizer
        hf = _load_gguf(path)
        _save_atomically(hf, target)
        return cls(hf)

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; BOS/EOS only with ``add_special_tokens``."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` exactly as the backend renders it (no space clean-up)."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The conversation rendered by the model's template (ChatML when it has none).

        A template that rejects the system role (Gemma, Mistral v0.1: it raises) gets the
        leading system text folded into the first user turn (``system + "\n\n" + user``),
        with a ``SystemPromptFoldedWarning``; the system text is never dropped.

        Raises:
            ValueError: the template rejects the conversation (e.g. an unsupported role).
        """
        has_system = bool(messages) and messages[0].get("role") == "system"
        if has_system and self._system_role_ok is False:
            return self._render_folded(messages, add_generation_prompt)
        try:
            text = self._render(messages, add_generation_prompt)
        except ValueError as err:
            if not has_system or self._system_role_ok:
                raise
            try:
                text = self._render_folded(messages, add_generation_prompt)
            except ValueError:
                raise err from err.__cause__  # the system role was not the (only) problem
            self._system_role_ok = False
            return text
        if has_system:
            self._system_role_ok = True
        return text

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        kwargs = {"chat_template": CHATML_TEMPLATE} if self._uses_fallback_template else {}
        try:
            text = self.hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
            )
        except Exception as err:  # jinja2 errors, raise_exception() in templates
            raise ValueError(f"chat template failed: {_one_line(err)}") from err
        return text if isinstance(text, str) else text[0]

    def _render_folded(self, messages: list[dict], add_generation_prompt: bool) -> str:
        text = self._render(fold_system_messages(messages), add_generation_prompt)
        warnings.warn(
            "the chat template does not support a system prompt; it was put at the start of "
            "the first user message",
            SystemPromptFoldedWarning,
            stacklevel=3,
        )
        return text

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True
                            ) -> list[int]:
        """Prompt token ids of a conversation (``[{"role": ..., "content": ...}, ...]``).

        The rendered text is encoded without adding special tokens (the template writes its
        own); a BOS that the tokenizer would add but the template omits is prepended, and a
        doubled BOS is collapsed, so there is exactly one when the model uses one.

        Raises:
            ValueError: the template rejects the conversation.
        """
        ids = self.encode(self.render_chat_template(messages, add_generation_prompt))
        bos = self.bos_token_id
        if bos is not None and self._bos_added:
            while len(ids) > 1 and ids[0] == bos and ids[1] == bos:
                ids.pop(0)
            if not ids or ids[0] != bos:
                ids.insert(0, bos)
        return ids

    # ------------------------------------------------------------------ properties
    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's own EOS id (``stop_token_ids`` may hold more)."""
        return self.hf.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        """The BOS id, or ``None`` when the tokenizer defines none."""
        return self.hf.bos_token_id

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (``len(hf)``)."""
        return len(self.hf)

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of the special tokens (skipped by ``decode(skip_special_tokens=True)``)."""
        return sorted(self.special_ids)

    # ------------------------------------------------------------------ internals
    def _adds_bos(self) -> bool:
        bos = self.bos_token_id
        with_special = self.backend.encode("a", add_special_tokens=True).ids
        return bool(with_special) and with_special[0] == bos and self.encode("a")[:1] != [bos]

    def _find_stop_ids(self, extra_eos_ids: tuple[int, ...]) -> frozenset[int]:
        ids = set(extra_eos_ids)
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        tok = self.end_of_turn_token()
        if tok is not None:
            ids.add(self.hf.convert_tokens_to_ids(tok))
        return frozenset(ids)

    def end_of_turn_token(self) -> str | None:
        """The special token the template writes right after an assistant reply, if any."""
        messages = [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": _SENTINEL}]
        try:
            text = self.render_chat_template(messages, add_generation_prompt=False)
        except ValueError:
            return None
        if _SENTINEL not in text:
            return None
        tail = text[text.rindex(_SENTINEL) + len(_SENTINEL):].lstrip()
        known = {self.hf.convert_ids_to_tokens(i) for i in self.special_ids}
        candidates = sorted(known | set(END_OF_TURN_TOKENS), key=len, reverse=True)
        for tok in candidates:
            if tail.startswith(tok) and self.backend.token_to_id(tok) is not None:
                return tok
        return None


def fold_system_messages(messages: list[dict]) -> list[dict]:
    """Fold the leading system message(s) into the first user message.

    ``[system S, user U, ...]`` becomes ``[user S + "\n\n" + U, ...]``; with no user message
    right after the system text, it becomes a user message of its own.
    """
    i = 0
    while i < len(messages) and messages[i].get("role") == "system":
        i += 1
    system = "\n\n".join(str(m.get("content", "")) for m in messages[:i])
    rest = [dict(m) for m in messages[i:]]
    if not system:
        return rest
    if rest and rest[0].get("role") == "user":
        rest[0]["content"] = system + "\n\n" + str(rest[0].get("content", ""))
        return rest
    return [{"role": "user", "content": system}, *rest]


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _load_hf(folder: Path, cls: Any = None, **kwargs: Any) -> Any:
    """``cls.from_pretrained`` (default ``AutoTokenizer``) of ``folder``; one-line
    ``ModelLoadError`` on any failure."""
    if cls is None:
        from transformers import AutoTokenizer as cls

    try:
        return cls.from_pretrained(folder, trust_remote_code=False, **kwargs)
    except Exception as err:  # transformers raises many kinds for bad files
        where = folder / kwargs["gguf_file"] if "gguf_file" in kwargs else folder
        raise ModelLoadError(f"cannot load the tokenizer from {where}: {_one_line(err)}") from err


def _load_gguf(file: Path) -> Any:
    """transformers' tokenizer of GGUF ``file``.

    ``AutoTokenizer`` with ``gguf_file`` parses the whole file with ``gguf.GGUFReader`` only
    to learn the model type (15-17 s for a Qwen2.5 file's 151k-token vocabulary on a 2-core
    CPU). The model type comes from the one-pass header read instead
    (``loader.gguf_config.model_type_of``) and is passed as ``tokenizer_type`` where
    transformers maps that type to a tokenizer class; it then picks the class the config
    would have given it. A ``llama`` file, which transformers 5 maps to no class of its own,
    gets the class ``AutoTokenizer`` falls back to there, ``TokenizersBackend`` (4.9 -> 0.4 s
    for SmolLM2). ``tests/engine/loader/test_gguf_header.py`` checks the result against the
    plain ``AutoTokenizer`` call. Other types take the plain call.
    """
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    from .loader.gguf_config import model_type_of
    from .loader.gguf_header import read_gguf_header

    model_type = model_type_of(read_gguf_header(file))
    if TOKENIZER_MAPPING_NAMES.get(model_type):
        return _load_hf(file.parent, gguf_file=file.name, tokenizer_type=model_type)
    import transformers

    backend = getattr(transformers, "TokenizersBackend", None)  # transformers >= 5
    if model_type == "llama" and model_type not in TOKENIZER_MAPPING_NAMES and backend:
        return _load_hf(file.parent, backend, gguf_file=file.name)
    return _load_hf(file.parent, gguf_file=file.name)


def _generation_config_eos(folder: Path) -> tuple[int, ...]:
    """EOS ids from ``generation_config.json`` (an int or a list), if the folder has one."""
    try:
        value = json.loads((folder / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int))
    return ()


def _save_atomically(hf: Any, target: Path) -> None:
    """``save_pretrained`` into a temp folder, then rename it to ``target``.

    A failure to write the cache is not fatal: the tokenizer in memory is still good.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
        tmp.chmod(0o755)
    except OSError:
        return
    try:
        hf.save_pretrained(tmp)
        compact_tokenizer_json(tmp / "tokenizer.json")
        os.replace(tmp, target)
    except (OSError, ValueError):
        pass  # another process won the race, or the disk is read-only/full
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
