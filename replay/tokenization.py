"""Render OpenAI chat-completions requests with a local chat template and tokenise them, offline.

A replay of chat traffic must count the prompt tokens vLLM would count. vLLM renders a chat
request with the model's chat template (Jinja, through ``transformers``' ``apply_chat_template``)
and tokenises the text *without* adding special tokens (the template already holds them). This
module does the same with the ``tokenizers`` library and ``jinja2`` directly, from a local
tokenizer directory, so no model hub is ever contacted and ``transformers`` is not needed:

- ``tokenizer.json`` is loaded with ``tokenizers.Tokenizer.from_file``;
- the template comes from ``chat_template.jinja`` or, failing that, ``tokenizer_config.json``'s
  ``chat_template`` (a string, or a list of ``{name, template}`` where ``default`` is used);
- the Jinja environment is the one transformers 4.4x-5.x uses for chat templates: sandboxed,
  ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter
  that does ``json.dumps(..., ensure_ascii=False)``, and the ``raise_exception`` and
  ``strftime_now`` globals; ``bos_token``/``eos_token``/``pad_token`` strings are passed in;
- messages are first normalised as vLLM 0.32/0.33 does for string-content templates
  (``vllm/entrypoints/chat_utils.py``, ``parse_chat_messages`` and ``_postprocess_messages``):
  a list of content parts becomes its text parts joined with a newline, ``None`` becomes ``""``,
  tool-call ``arguments`` strings are parsed to JSON objects; tools become
  ``{"type", "function": {"name", "description", "parameters"}}``. Checked: the rendered text
  and token ids equal ``transformers`` 5.19 ``apply_chat_template`` on this tokenizer (plain,
  tool-call and tools chats; ``tests/test_replay_io_tokenization.py`` when transformers is
  installed).

``HF_HUB_OFFLINE=1`` is set on import as a guard for any library that might look for a hub.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from prefixscope.core.documents import load_config_file, parse_json
from prefixscope.core.paths import data_file
from prefixscope.core.errors import ConfigError, SourceUnavailable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: The tokenizer shipped with prefixscope (also the tiny Llama's tokenizer for a live vLLM).
BUNDLED_TOKENIZER_DIR = data_file("tiny-tokenizer")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' chat-template tojson (utils/chat_template_utils.py): no HTML escaping.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@dataclass(frozen=True)
class ChatTokenizer:
    """A local tokenizer and its chat template.

    Attributes:
        directory: where it was loaded from.
        template_source: the Jinja source of the chat template.
        special: ``bos_token``, ``eos_token``, ``pad_token`` strings from the config (or None).
    """

    directory: Path
    template_source: str
    special: Mapping[str, str | None]
    _tokenizer: Any
    _template: Any

    @property
    def vocab_size(self) -> int:
        """Number of token ids (including added special tokens)."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def render(self, messages: Sequence[Mapping[str, Any]], *,
               tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True,
               **template_kwargs: Any) -> str:
        """Render a chat (OpenAI ``messages``, optional ``tools``) to the prompt text.

        Messages and tools are normalised as vLLM does (see the module docstring) first.

        Raises:
            ConfigError: the template failed (names the template and the reason).
        """
        from jinja2.exceptions import TemplateError

        norm_messages = [normalise_message(m) for m in messages]
        norm_tools = [normalise_tool(t) for t in tools] if tools else None
        try:
            return self._template.render(
                messages=norm_messages, tools=norm_tools,
                add_generation_prompt=add_generation_prompt,
                **{k: v for k, v in self.special.items()}, **template_kwargs)
        except (TemplateError, TypeError, KeyError) as exc:
            raise ConfigError(f"chat template of {self.directory} failed: {exc}") from exc
        except (ArithmeticError, LookupError, ValueError, AttributeError, RecursionError) as exc:
            # The template is the model's code: its own errors (the sandbox's range limit,
            # a division by zero, an index past the end) are the template's, named as such.
            raise ConfigError(f"chat template of {self.directory} failed: "
                              f"{type(exc).__name__}: {exc}") from exc

    @property
    def end_of_turn(self) -> str:
        """The text that ends an assistant turn: what the template puts after an assistant
        message's content, found by rendering a probe (``<|im_end|>`` for ChatML); ``""`` when
        it cannot be found."""
        probe = "\x00probe\x00"
        text = self.render([{"role": "user", "content": "u"},
                            {"role": "assistant", "content": probe}],
                           add_generation_prompt=False)
        tail = text.split(probe, 1)[1] if probe in text else ""
        return tail.rstrip("\n") if tail.strip() else ""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without adding special tokens (special-token text is matched)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[Mapping[str, Any]] | None = None,
                    add_generation_prompt: bool = True) -> list[int]:
        """Prompt token ids of a chat request, as vLLM's chat endpoint would count them."""
        return self.encode(self.render(messages, tools=tools,
                                       add_generation_prompt=add_generation_prompt))


def normalise_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One chat message as vLLM hands it to a string-content template.

    ``content``: a string stays; a list of parts becomes the ``text`` of its text parts joined
    by ``"\\n"`` (other part types are dropped: images are out of scope); None becomes ``""``.
    ``tool_calls`` are kept with ``function.arguments`` parsed from JSON when it is a string
    (an empty or missing value becomes ``{}``). ``name`` and ``tool_call_id`` are kept.
    """
    role = str(message.get("role", ""))
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text" and "text" in part:
                parts.append(str(part["text"]))
        text = "\n".join(parts)
    else:
        text = str(content)
    out: dict[str, Any] = {"role": role, "content": text}
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list):
        norm_calls = []
        for call in calls:
            call = dict(call) if isinstance(call, Mapping) else {}
            fn = dict(call.get("function") or {})
            args = fn.get("arguments")
            if not args:
                fn["arguments"] = {}
            elif isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args)
                except json.JSONDecodeError:
                    fn["arguments"] = args
            call["function"] = fn
            norm_calls.append(call)
        out["tool_calls"] = norm_calls
    if role == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def normalise_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """One tool definition as vLLM 0.32 passes it to the template (``model_dump`` of
    ``ChatCompletionToolsParam``, ``vllm/entrypoints/openai/chat_completion/protocol.py`` and
    ``FunctionDefinition`` in ``vllm/entrypoints/generate/base/protocol.py``):
    ``{"type": "function", "function": {"name", "description", "parameters"[, "strict"]}}``,
    missing ``description``/``parameters`` as None, ``strict`` only when set, keys in that
    order."""
    fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    function = {
        "name": fn.get("name"),
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
    }
    if fn.get("strict") is not None:
        function["strict"] = fn["strict"]
    return {"type": tool.get("type", "function"), "function": function}


#: Largest ``tokenizer.json`` read, bytes: the vocabularies of current open models are 2-35 MB
#: (Llama 3 9 MB, Gemma 3 33 MB); the other files of a tokenizer folder take the 16 MiB of
#: every document (``prefixscope.core.documents``).
TOKENIZER_JSON_MAX_BYTES = 64 << 20


def _read_file(path: Path, what: str, parse=str, **kw: Any) -> Any:
    """A file of a tokenizer folder through ``prefixscope.core.documents`` (one regular file,
    bounded, strict UTF-8, depth-checked when parsed), or None when there is none.

    Raises:
        SourceUnavailable: not a regular file (a FIFO, a device, a folder) or unreadable.
        ConfigError: too large, not UTF-8, not valid JSON, nested too deep.
    """
    if not os.path.lexists(path):
        return None
    return load_config_file(path, what=what, parse=parse, **kw)


def _read_template(directory: Path, config: Mapping[str, Any]) -> str:
    jinja_file = directory / "chat_template.jinja"
    text = _read_file(jinja_file, "chat template")
    if text is not None:
        return text
    tpl = config.get("chat_template")
    if isinstance(tpl, str):
        return tpl
    if isinstance(tpl, list):
        for item in tpl:
            if isinstance(item, Mapping) and item.get("name") == "default":
                return str(item.get("template"))
    raise ConfigError(
        f"{directory}: no chat template (neither chat_template.jinja nor "
        "tokenizer_config.json:chat_template)")


def _token_string(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@lru_cache(maxsize=8)
def _load(directory: str) -> ChatTokenizer:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tokenizers import Tokenizer

    d = Path(directory)
    tok_file = d / "tokenizer.json"
    tok_text = _read_file(tok_file, "tokenizer.json", limit=TOKENIZER_JSON_MAX_BYTES)
    if tok_text is None:
        raise SourceUnavailable(f"{d}: no tokenizer.json (give --tokenizer DIR with tokenizer.json "
                                "and tokenizer_config.json)")
    cfg_file = d / "tokenizer_config.json"
    config = _read_file(cfg_file, "tokenizer config", parse=parse_json)
    if config is None:
        config = {}
    elif not isinstance(config, dict):
        raise ConfigError(f"{cfg_file}: not a JSON object")
    try:
        tokenizer = Tokenizer.from_str(tok_text)
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise ConfigError(f"{tok_file}: cannot load tokenizer ({exc})") from exc
    source = _read_template(d, config)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        template = env.from_string(source)
    except Exception as exc:
        raise ConfigError(f"{d}: chat template does not compile ({exc})") from exc
    special = {name: _token_string(config.get(name))
               for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return ChatTokenizer(directory=d, template_source=source, special=special,
                         _tokenizer=tokenizer, _template=template)


def load_chat_tokenizer(directory: str | os.PathLike[str] | None = None) -> ChatTokenizer:
    """Load a tokenizer directory (default: the bundled ``data/tiny-tokenizer``), cached.

    Args:
        directory: folder with ``tokenizer.json`` and ``tokenizer_config.json`` and/or
            ``chat_template.jinja`` (what ``save_pretrained`` writes).

    Raises:
        SourceUnavailable: no ``tokenizer.json`` there.
        ConfigError: unreadable config, no chat template, or a template that does not compile.
    """
    d = Path(directory) if directory is not None else BUNDLED_TOKENIZER_DIR
    return _load(str(d.resolve()))
