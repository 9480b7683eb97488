"""Two realistic chat logs for ``prefixscope diagnose``, written by construction, each with
switches that remove one breaker (issue 26's "Done when": ground truth measured by replaying
the same log with that breaker removed).

- :func:`rag_log`: a support assistant with retrieval ("Helix", for a hosting company).
  Breakers: ``docs`` a block of retrieved documents in the system prompt, before the history,
  that changes every turn; ``account`` a line with two changing fields ("Account: 71810 (seat
  dana.k)", per conversation) on line 2 of the system prompt; ``reply`` the client re-sends
  the model's earlier replies with their whitespace collapsed (some conversations).
- :func:`agent_log`: a coding agent ("Forge") with tools. Breakers: ``timestamp`` a
  "Timestamp:" line in the system prompt, new every request; ``tool_date`` today's date inside
  the ``search_docs`` tool's description (a new day every two conversations); ``truncate`` the
  client drops the oldest exchanges once a conversation passes four turns.

``python -m tests.diagnose_logs DIR`` writes both logs (as recorded) to DIR.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Iterable
from pathlib import Path

RAG_BREAKERS = ("docs", "account", "reply")
AGENT_BREAKERS = ("timestamp", "tool_date", "truncate")

_TOPICS = ["DNS records", "TLS certificates", "object storage", "managed Postgres", "backups",
           "load balancers", "firewall rules", "billing", "Kubernetes nodes", "SSH keys",
           "snapshots", "CDN caching", "email relay", "private networks", "API tokens",
           "usage alerts", "domain transfers", "IPv6", "volume resizing", "support plans"]
_VERBS = ["configure", "rotate", "restore", "inspect", "limit", "migrate", "monitor", "renew"]


def _sentence(rnd: random.Random, topic: str) -> str:
    return (f"To {rnd.choice(_VERBS)} {topic}, open the control panel, choose the project, "
            f"then {rnd.choice(_VERBS)} the {rnd.choice(_TOPICS)} settings; changes apply "
            f"within {rnd.randrange(2, 60)} minutes and are logged in the audit trail.")


def _document_pool(seed: int, n: int = 40) -> list[str]:
    rnd = random.Random(seed)
    return [f"[doc {k}] {_TOPICS[k % len(_TOPICS)]}: " + " ".join(
        _sentence(rnd, _TOPICS[k % len(_TOPICS)]) for _ in range(2)) for k in range(n)]


RAG_RULES = "\n".join([
    "You are Helix, the support assistant of Stratus Hosting.",
    "Answer only from the retrieved documents below and cite them as [doc N].",
    "If the documents do not answer the question, say so and offer to open a ticket.",
    "Never reveal internal hostnames, credentials or other customers' data.",
    "Keep answers under 150 words unless the customer asks for detail.",
    "Use the customer's plan limits when you talk about quotas or prices.",
    "Prefer step-by-step instructions with the exact menu names of the control panel.",
    "When a change can cause downtime, say so before the steps and suggest a maintenance window.",
    "Escalate to a human for refunds above 200 EUR, legal requests or suspected abuse.",
] + [_sentence(random.Random(7 + k), _TOPICS[k]) for k in range(12)])
_QUESTIONS = ["How do I {v} my {t}?", "It did not work, the panel shows an error. Why?",
              "Can I automate that with the API?", "What does it cost on my plan?",
              "Thanks. One more: how do I {v} the {t2}?"]
_ACCOUNTS = [("71810", "dana.k"), ("55321", "rui.p"), ("90417", "mei.t"), ("12093", "olu.a"),
             ("38250", "kim.s"), ("64471", "ana.b")]


def _reply(rnd: random.Random, c: int, turn: int) -> str:
    steps = "\n".join(f"{k}. {_sentence(rnd, rnd.choice(_TOPICS))}" for k in range(1, 4))
    return (f"Here is what to do (conversation {c}, answer {turn}):\n\n{steps}\n\n"
            f"See [doc {rnd.randrange(40)}] for details.")


def rag_log(path: Path, *, without: Iterable[str] = (), conversations: int = 6,
            turns: int = 4) -> Path:
    """The RAG assistant's log at ``path``: ``conversations`` x ``turns`` requests, with the
    breakers named in ``without`` (of :data:`RAG_BREAKERS`) removed: ``docs`` the same
    documents in every request, ``account`` the same account line, ``reply`` replies re-sent
    verbatim. Every request records the model's reply (``response_text``)."""
    off = set(without)
    pool = _document_pool(3)
    records, t = [], 0.0
    for c in range(conversations):
        rnd = random.Random(100 + c)
        acct, seat = _ACCOUNTS[0] if "account" in off else _ACCOUNTS[c % len(_ACCOUNTS)]
        history: list[dict] = []
        collapse = c % 2 == 1 and "reply" not in off
        for turn in range(turns):
            docs = pool[:5] if "docs" in off else random.Random(c * 31 + turn).sample(pool, 5)
            system = (RAG_RULES.split("\n")[0] + f"\nAccount: {acct} (seat {seat})\n"
                      + "\n".join(RAG_RULES.split("\n")[1:])
                      + "\n\nRetrieved documents:\n" + "\n".join(docs)
                      + "\nEnd of documents. Cite them as [doc N].")
            q = _QUESTIONS[turn % len(_QUESTIONS)].format(
                v=rnd.choice(_VERBS), t=rnd.choice(_TOPICS), t2=rnd.choice(_TOPICS))
            messages = [{"role": "system", "content": system}, *history,
                        {"role": "user", "content": q}]
            reply = _reply(rnd, c, turn)
            records.append({"request_id": f"rag-{c}-{turn}", "t": t, "model": "helix",
                            "messages": messages, "response_text": reply})
            sent = re.sub(r"\s+", " ", reply) if collapse else reply
            history = history + [{"role": "user", "content": q},
                                 {"role": "assistant", "content": sent}]
            t += 5.0
    return _write(path, records)


_AGENT_RULES = "\n".join([
    "You are Forge, a coding agent working in the user's repository.",
    "Read files before you edit them; never guess their content.",
    "Make the smallest change that solves the task and keep the existing style.",
    "Run the tests after every change and report the failures you could not fix.",
    "Never commit, push or delete branches unless the user asks.",
    "When a command needs network access, say why before you run it.",
] + [f"Convention {k}: " + _sentence(random.Random(50 + k), _TOPICS[k]) for k in range(14)])
_TOOL_NAMES = ("read_file", "write_file", "run_tests", "list_dir", "search_docs")
_TASKS = ["Fix the failing test in tests/test_api.py.", "Add a --verbose flag to the CLI.",
          "Rename the config loader and update its callers.", "Speed up the slow import.",
          "Document the public functions of utils.py.", "Make the retry logic configurable."]
_STEPS = ["Now run the tests again.", "Show me the diff.", "Also update the changelog.",
          "Handle the empty-input case too.", "Check the other callers.",
          "Looks good; tidy the imports.", "One more test for the error path, please."]


def _tools(day: int) -> list[dict]:
    out = []
    for name in _TOOL_NAMES:
        desc = f"{name.replace('_', ' ').capitalize()} in the user's repository."
        if name == "search_docs":
            desc = (f"Search the project documentation and the web. Today is 2026-03-{day:02d}; "
                    "prefer results from the last 12 months.")
        out.append({"type": "function", "function": {
            "name": name, "description": desc,
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "A path relative to the repository."},
                "query": {"type": "string", "description": "What to look for."}},
                "required": ["path"]}}})
    return out


def agent_log(path: Path, *, without: Iterable[str] = (), conversations: int = 6,
              turns: int = 7) -> Path:
    """The coding agent's log at ``path``, with the breakers named in ``without`` (of
    :data:`AGENT_BREAKERS`) removed: ``timestamp`` one fixed time, ``tool_date`` one fixed
    day, ``truncate`` the whole history kept."""
    off = set(without)
    records, t = [], 0.0
    for c in range(conversations):
        rnd = random.Random(300 + c)
        day = 2 if "tool_date" in off else 2 + c // 2
        history: list[dict] = []
        for turn in range(turns):
            minute = 0 if "timestamp" in off else (c * turns + turn)
            stamp = f"2026-03-02T10:{minute // 60:02d}:{minute % 60:02d}Z" if "timestamp" in off \
                else f"2026-03-{day:02d}T{9 + minute // 60:02d}:{minute % 60:02d}:{(7 * turn) % 60:02d}Z"
            system = (_AGENT_RULES.split("\n")[0] + f"\nTimestamp: {stamp}\n"
                      + "\n".join(_AGENT_RULES.split("\n")[1:]))
            task = _TASKS[c % len(_TASKS)] if turn == 0 else _STEPS[(c + turn) % len(_STEPS)]
            messages = [{"role": "system", "content": system}, *history,
                        {"role": "user", "content": task}]
            reply = (f"Done (step {turn}). I read the files, changed what the task needs and ran "
                     f"the tests: {rnd.randrange(20, 90)} passed. " + _sentence(rnd, "the code"))
            records.append({"request_id": f"agent-{c}-{turn}", "t": t, "model": "forge",
                            "messages": messages, "tools": _tools(day), "response_text": reply})
            history = history + [{"role": "user", "content": task},
                                 {"role": "assistant", "content": reply}]
            if "truncate" not in off and len(history) > 8:
                history = history[-4:]  # keep the last two exchanges
            t += 5.0
    return _write(path, records)


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


if __name__ == "__main__":  # pragma: no cover - a helper for looking at the logs
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    print(rag_log(out / "rag.jsonl"), agent_log(out / "agent.jsonl"))
