"""Build chat-request traces (the ``chat`` trace format) from captured conversations.

Sources:

- **aider chat history** (``.aider.chat.history.md``, the file aider writes in every repository
  it is used in): ``# aider chat started at YYYY-MM-DD HH:MM:SS`` opens a chat; a run of lines
  starting ``####`` is one user input; ``>`` lines are aider's console output (not sent to the
  model); the remaining lines up to the next input are the assistant's reply. Local commands
  (``/diff``, ``/add``, ``/run``...) are dropped; ``/ask``, ``/code`` and ``/architect`` send
  their argument. Each user input
  becomes one request holding the system prompt, the chat so far and the input. The log does
  not hold aider's system prompt, repository map or file contents: the requests carry a
  system prompt written for prefixscope (:data:`AIDER_STYLE_SYSTEM_PROMPT`, not aider's text)
  that has aider's volatile platform line ``- Current date: YYYY-MM-DD`` with the chat's date,
  near the top, where a date or time header usually sits. Arrival: the chat's start time plus
  :data:`AIDER_TURN_GAP_S` per earlier input of the chat (the log has no per-input times).
- **SWE-agent trajectories** (``*.traj``): each assistant message of ``history`` is one model
  call, whose prompt is every message before it (demonstrations included, as sent).

Every line gets ``t`` (seconds from the first request), ``request_id``, ``conversation``,
``messages`` (+ ``model``) and, when the reply is known, ``response_text`` (the reader turns it
into output token ids, so decode blocks are cached as vLLM would if the model produced it).
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefixscope.core.bounds import open_regular
from prefixscope.core.documents import load_json_file
from prefixscope.core.errors import ParseError, SourceUnavailable

#: Seconds assumed between two user inputs of one aider chat (the log records no times).
AIDER_TURN_GAP_S = 30.0

#: A coding-assistant system prompt in aider's layout, written for prefixscope (not aider's
#: text). ``{date}`` is the volatile line; everything after it is identical for every chat.
AIDER_STYLE_SYSTEM_PROMPT = """\
You are a careful senior software engineer pair-programming with the user in their git repository.
- Platform: macOS-14.5-arm64-arm-64bit
- Shell: SHELL=/bin/zsh
- Language: English
- Current date: {date}
- The user is working inside a git repository.

How to work:
Follow the conventions, libraries and style already used in the code base. Prefer small, well
named functions and clear error messages. If a request is ambiguous, ask one short question
before changing anything. Explain what you are going to change in a few sentences, then give
every change as an edit block.

How to write an edit block:
1. The path of the file, alone on a line, exactly as the user gave it.
2. An opening fence with the language, for example ```python.
3. A line <<<<<<< SEARCH, then a contiguous run of lines copied exactly from the current file,
   including comments, blank lines and indentation.
4. A line =======, then the lines that replace them.
5. A line >>>>>>> REPLACE, then the closing fence.

Rules for edit blocks:
- The SEARCH part must match the file character for character; keep it short but unique.
- Use several small blocks rather than one large one; each block replaces the first match only.
- To create a new file, use an empty SEARCH part and the whole content in the REPLACE part.
- To move code, use one block to delete it and another to insert it at the new place.
- Only edit files the user has added to the chat; ask for any other file you need.
- Never leave placeholders such as "rest of the code unchanged": write the real lines.

When the user asks for a shell command, give it in a ```bash block, one command per line, suited
to the platform above, and say what it does. Do not run commands that delete data without saying
so first. Keep replies short: the user reads the edit blocks, not the prose.
"""


@dataclass
class AiderChat:
    """One aider chat: when it started and its (user input, assistant reply) turns."""

    started: datetime
    model: str | None
    turns: list[tuple[str, str]] = field(default_factory=list)


_HEADER = re.compile(r"^# aider chat started at (\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})\s*$")
_MODEL = re.compile(r"^> (?:Main model|Models?): (\S+)")


def _strip_md_break(line: str) -> str:
    # aider ends each log line with two spaces (a Markdown hard break).
    return line[:-2] if line.endswith("  ") else line


def _not_utf8(p: Path) -> ParseError:
    """``FILE:LINE: not UTF-8 text (byte N)`` for the first bad byte (N within its line)."""
    with open_regular(p) as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return ParseError(str(p), lineno, f"not UTF-8 text (byte {exc.start})")
    return ParseError(str(p), None, "not UTF-8 text")


def parse_aider_history(path: str | os.PathLike[str]) -> list[AiderChat]:
    """Parse an aider chat-history Markdown file into chats (oldest first).

    Text before the first ``# aider chat started`` header (a fragment) is ignored. A reply is
    the non-``>`` text after an input, stripped of surrounding blank lines.

    Raises:
        SourceUnavailable: the file does not exist or is not a regular file.
        ParseError: a header with an impossible date, or bytes that are not UTF-8
            (``not UTF-8 text (byte N)``, N within the line; names the line).
    """
    p = Path(path)
    try:
        raw_fh = open_regular(p)  # a FIFO, device or folder is refused by its kind
    except OSError as exc:
        raise SourceUnavailable(f"{p}: {exc}") from None
    chats: list[AiderChat] = []
    chat: AiderChat | None = None
    user: list[str] | None = None
    reply: list[str] = []

    def close_turn() -> None:
        nonlocal user, reply
        if chat is not None and user is not None:
            chat.turns.append(("\n".join(user).strip("\n"), "\n".join(reply).strip("\n")))
        user, reply = None, []

    with io.TextIOWrapper(raw_fh, encoding="utf-8") as fh:
        try:
            lines = list(fh)
        except UnicodeDecodeError:
            raise _not_utf8(p) from None
        for lineno, raw in enumerate(lines, start=1):
            line = raw.rstrip("\n")
            m = _HEADER.match(line)
            if m:
                close_turn()
                try:
                    started = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(
                        tzinfo=timezone.utc)
                except ValueError:
                    raise ParseError(str(p), lineno, "impossible date in chat header") from None
                chat = AiderChat(started=started, model=None)
                chats.append(chat)
                continue
            if chat is None:
                continue
            if line.startswith("####"):
                text = _strip_md_break(line[4:])
                text = text[1:] if text.startswith(" ") else text
                if user is not None and not reply:
                    user.append(text)
                else:
                    close_turn()
                    user = [text]
                continue
            if line.startswith(">"):
                mm = _MODEL.match(line)
                if mm and chat.model is None:
                    chat.model = mm.group(1)
                continue
            if user is not None:
                reply.append(_strip_md_break(line))
    close_turn()
    for c in chats:
        c.turns = [t for t in (_as_sent(u, r) for u, r in c.turns) if t is not None]
    return chats


#: aider commands whose argument is sent to the model as the user message.
_SENDING_COMMANDS = ("/ask ", "/code ", "/architect ")


def _as_sent(user: str, reply: str) -> tuple[str, str] | None:
    """The turn as the model saw it, or None for a local command (``/diff``, ``/add``...) or an
    empty input."""
    text = user.strip()
    if not text:
        return None
    if text.startswith("/"):
        for cmd in _SENDING_COMMANDS:
            if text.startswith(cmd):
                return text[len(cmd):].strip(), reply
        return None
    return user, reply


def _clip(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars]


def aider_chat_requests(path: str | os.PathLike[str], *, chats_per_day: int | None = None,
                        max_turns: int | None = None, max_message_chars: int | None = None,
                        system_prompt: str = AIDER_STYLE_SYSTEM_PROMPT) -> Iterator[dict[str, Any]]:
    """Chat-trace lines from an aider history: one per user input (see the module docstring).

    Args:
        path: the chat-history Markdown file.
        chats_per_day: keep only the first N chats (with at least one input) of each UTC day.
        max_turns: keep only the first N inputs of each chat.
        max_message_chars: cut every input and reply to this many characters.
        system_prompt: template with ``{date}`` (the chat's start date, ``YYYY-MM-DD``).

    Yields:
        dicts ``{t, request_id, conversation, model, messages, response_text}``, oldest first.
    """
    chats = [c for c in parse_aider_history(path) if c.turns]
    if chats_per_day is not None:
        per_day: dict[str, int] = {}
        kept = []
        for c in chats:
            day = c.started.strftime("%Y-%m-%d")
            if per_day.get(day, 0) < chats_per_day:
                per_day[day] = per_day.get(day, 0) + 1
                kept.append(c)
        chats = kept
    if not chats:
        return
    t0 = chats[0].started.timestamp()
    for k, chat in enumerate(chats):
        system = system_prompt.format(date=chat.started.strftime("%Y-%m-%d"))
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        turns = chat.turns if max_turns is None else chat.turns[:max_turns]
        for i, (user, reply) in enumerate(turns):
            messages.append({"role": "user", "content": _clip(user, max_message_chars)})
            line: dict[str, Any] = {
                "t": round(chat.started.timestamp() - t0 + i * AIDER_TURN_GAP_S, 3),
                "request_id": f"aider-{k + 1:04d}-{i + 1:02d}",
                "conversation": f"aider-{k + 1:04d}",
                "model": chat.model or "aider",
                "messages": [dict(m) for m in messages],
            }
            reply = _clip(reply, max_message_chars)
            if reply:
                line["response_text"] = reply
            yield line
            messages.append({"role": "assistant", "content": reply})


def _swe_tool_calls(value: Any) -> list[dict[str, Any]] | None:
    if isinstance(value, list):
        return value
    if isinstance(value, str) and value.strip():
        try:
            parsed = ast.literal_eval(value)  # SWE-agent stores a Python repr
        except (ValueError, SyntaxError):
            return None
        return parsed if isinstance(parsed, list) else None
    return None


def swe_agent_chat_requests(path: str | os.PathLike[str], *, model: str = "swe-agent") \
        -> Iterator[dict[str, Any]]:
    """Chat-trace lines from a SWE-agent trajectory: one per assistant message (model call).

    Arrival: one call every :data:`AIDER_TURN_GAP_S` seconds (trajectories hold no times).

    Raises:
        SourceUnavailable: missing file. ParseError: not JSON or no ``history`` list.
    """
    p = Path(path)
    doc = load_json_file(p)  # missing, a FIFO or a folder: SourceUnavailable naming it
    history = doc.get("history") if isinstance(doc, dict) else None
    if not isinstance(history, list):
        raise ParseError(str(p), None, "missing or not a list", "$.history")
    messages: list[dict[str, Any]] = []
    calls = 0
    for item in history:
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            continue
        msg: dict[str, Any] = {"role": item["role"], "content": item.get("content") or ""}
        tool_calls = _swe_tool_calls(item.get("tool_calls"))
        if item["role"] == "assistant":
            line = {"t": calls * AIDER_TURN_GAP_S, "request_id": f"{p.stem}-{calls + 1:03d}",
                    "conversation": p.stem, "model": model,
                    "messages": [dict(m) for m in messages]}
            if msg["content"]:
                line["response_text"] = msg["content"]
            if messages:
                yield line
            calls += 1
            if tool_calls:
                msg["tool_calls"] = tool_calls
        elif item["role"] == "tool":
            ids = item.get("tool_call_ids")
            if isinstance(ids, str):
                try:
                    ids = ast.literal_eval(ids)
                except (ValueError, SyntaxError):
                    ids = None
            if isinstance(ids, list) and ids:
                msg["tool_call_id"] = ids[0]
        messages.append(msg)


def write_chat_trace(lines: Iterable[dict[str, Any]], out: str | os.PathLike[str]) -> int:
    """Write chat-trace lines as JSONL (UTF-8, one compact object per line); returns the count.

    Written to ``OUT.part`` and renamed when every line is written: a source that fails half
    way (``lines`` raising, e.g. a capture line that is not UTF-8) leaves no partial trace and
    keeps an existing ``OUT`` as it was."""
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    part = p.with_name(p.name + ".part")
    n = 0
    try:
        with open(part, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
                n += 1
        os.replace(part, p)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return n
