"""Render a model's Jinja chat template the way transformers does, without importing transformers.

Importing ``transformers.utils.chat_template_utils`` imports the whole ``transformers`` package
(about 5 s on a 2-core machine), while ``jinja2`` itself imports in ~50 ms. This module builds
the same environment as transformers' ``_compile_jinja_template`` (transformers 5.x,
``utils/chat_template_utils.py``): a sandboxed immutable environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block that renders
its body, a ``tojson`` filter that does not escape HTML, and the globals ``raise_exception``,
``strftime_now``, ``dict`` and ``namespace`` (underscore names refused). The render receives
the same variables as ``PreTrainedTokenizerBase.apply_chat_template(tokenize=False)``:
``messages`` (keys whose value is ``None`` dropped; a reasoning field aliased to
``reasoning_content`` and ``thinking``), ``tools=None``, ``documents=None``,
``add_generation_prompt`` and the named special tokens (``bos_token``, ``eos_token``, ...).
``tests/engine/test_chat_template.py`` pins equality with transformers' output.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat_template(template: str, messages: list[dict], *, add_generation_prompt: bool,
                         special_tokens: dict[str, str]) -> str:
    """``template`` rendered over ``messages`` (``[{"role": str, "content": str}, ...]``).

    ``special_tokens`` maps ``bos_token``/``eos_token``/... to their text, as transformers'
    ``special_tokens_map`` does. Raises whatever jinja2 raises (``TemplateError`` from a
    template's ``raise_exception``, ``TemplateSyntaxError``, ``UndefinedError``, ...).
    """
    compiled = _compile(template)
    chat = [_normalize(m) for m in messages]
    return compiled.render(messages=chat, tools=None, documents=None,
                           add_generation_prompt=add_generation_prompt, **special_tokens)


def _normalize(message: dict) -> dict:
    """A fresh copy without ``None`` values, reasoning aliased as transformers does."""
    out = {k: v for k, v in message.items() if v is not None}
    reasoning = next((out[k] for k in _REASONING_FIELDS if out.get(k) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body (transformers uses it
        to track assistant tokens; rendering is the same)."""

        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body
                                          ).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes ({name!r})")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)
