"""Commands are module-level functions over library calls: importable and callable without the
CLI runner, registered under the names the CLI has always had, sharing option declarations."""

from __future__ import annotations

import json

import typer.main

from prefixscope.cli import app
from prefixscope.cli.commands import db as db_commands
from prefixscope.cli.commands import replay_sim
from prefixscope.core.errors import NothingIngested


def _commands():
    root = typer.main.get_command(app)
    found = {}

    def walk(cmd, prefix):
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            if sub.callback is not None:  # groups without a callback of their own: no command
                found[" ".join(prefix + [name])] = sub
            walk(sub, prefix + [name])

    walk(root, [])
    return found


def test_every_command_is_a_module_level_function():
    commands = _commands()
    assert len(commands) >= 20
    for path, cmd in commands.items():
        fn = cmd.callback
        assert "<locals>" not in fn.__qualname__, f"prefixscope {path}: {fn.__qualname__} is a closure"
        assert fn.__module__.startswith("prefixscope.cli.commands."), (path, fn.__module__)
        module = __import__(fn.__module__, fromlist=["_"])
        defined = getattr(module, fn.__name__)  # Typer registers a wrapper with the same name
        assert defined is getattr(fn, "__wrapped__", fn), f"prefixscope {path}: not importable"


def test_sim_and_compare_share_the_trace_options():
    commands = _commands()

    def opts(path):
        return {p.name: (tuple(p.opts), p.help, getattr(p, "min", None))
                for p in commands[path].params}

    sim, compare = opts("replay sim"), opts("replay compare")
    shared = ["trace", "fmt", "block_size", "algo", "hash_id_block_size", "output_tokens",
              "concurrency", "tokenizer", "limit", "t0", "ingest", "db", "as_json"]
    for name in shared:
        assert sim[name] == compare[name], name


def test_db_commands_called_directly(tmp_path, capsys):
    db = str(tmp_path / "direct.duckdb")
    db_commands.migrate_cmd(db=db)
    assert capsys.readouterr().out.startswith(f"{db}: schema migrations ")
    db_commands.info_cmd(db=db, as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert doc["db"] == db
    assert len(doc["migrations"]) >= 1
    assert doc["tables"]["requests"] == 0


def test_sim_called_directly_on_the_bundled_chat_trace(tmp_path, capsys, data_dir):
    replay_sim.sim_cmd(trace=data_dir / "captures" / "aider" / "chat-requests.jsonl",
                       fmt="chat", out_dir=tmp_path / "run", run_id="direct-1",
                       db=str(tmp_path / "x.duckdb"), as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert doc["run_id"] == "direct-1"
    assert doc["requests"] > 0
    assert 0 < doc["hit_rate"] <= 1
    assert (tmp_path / "run" / "requests.jsonl").is_file()


def test_sim_called_directly_raises_the_library_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    try:
        replay_sim.sim_cmd(trace=empty, fmt="chat", out_dir=tmp_path / "run",
                           db=str(tmp_path / "x.duckdb"), as_json=True)
    except NothingIngested as exc:
        assert "no usable requests" in str(exc)
    else:
        raise AssertionError("an empty trace must raise NothingIngested")
