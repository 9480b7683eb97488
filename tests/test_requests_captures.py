"""Real provider usage captured by pydantic-ai's test cassettes (data/pydantic-ai/): the
figures the data pack lists under "Request captures", through the file ingest."""

from __future__ import annotations

import pytest

from prefixscope.ingest.usage import ingest_usage_file_detailed

FIGURES = {
    # file: [(prompt_tokens inclusive, cached_tokens, cache_write_tokens), ...] in line order
    "test_openai_chat_prompt_cache_e2e": [(4020, 0, 4012), (4020, 4012, 0)],
    "test_openrouter_cache_all_settings_real_api": [(2572, 0, 2569), (2649, 2569, 79),
                                                    (2572, 2240, 329)],
    "test_openrouter_cache_messages_anthropic_real_api": [(3214, 0, 3211), (3329, 3211, 115)],
    "test_openrouter_cache_instructions_gemini_real_api": [(2168, 2161, 2161),
                                                           (2167, 2161, 0)],
    "test_deepseek_deferred_capability_with_thinking": [(563, 512, None), (875, 0, None),
                                                        (976, 896, None)],
    "test_mistral_history_uses_prompt_cache": [(253, 0, None), (268, 224, None)],
    # Groq: the first interaction is an error (usage null), then no details object (NULL), 256
    "test_tool_use_failed_error": [(301, None, None), (336, 256, None)],
    "test_openai_prompted_output_multiple": [(273, 0, None), (294, 0, None)],
    "test_openai_instructions_with_tool_calls_keep_instructions": [(50, 0, None), (75, 0, None)],
    # Anthropic: input_tokens 3, 3 and 2 EXCLUDE reads and writes; stored inclusive
    "test_anthropic_cache_real_api": [(3 + 1111 + 0, 1111, 0), (3 + 1111 + 418, 1111, 418)],
    "test_inline_system_prompt_cache_prefix_is_reused": [(2 + 0 + 1590, 0, 1590),
                                                         (2 + 1590 + 0, 1590, 0)],
}
MODELS = {
    "test_anthropic_cache_real_api": "claude-sonnet-4-5",
    "test_tool_use_failed_error": "openai/gpt-oss-120b",
    "test_openrouter_cache_instructions_gemini_real_api": "google/gemini-2.5-flash",
    "test_deepseek_deferred_capability_with_thinking": "deepseek-reasoner",
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_capture_figures(con, data_dir, name):
    path = data_dir / "pydantic-ai" / f"{name}.jsonl"
    summary, problems = ingest_usage_file_detailed(con, path)
    got = con.execute("SELECT prompt_tokens, cached_tokens, cache_write_tokens FROM requests "
                      "ORDER BY line").fetchall()
    assert got == FIGURES[name]
    if name == "test_tool_use_failed_error":
        assert [(q.line, q.field) for q in problems] == [(1, "$.response_usage")]
    else:
        assert problems == []
    rows = con.execute("SELECT DISTINCT endpoint, ts_estimated, model FROM requests").fetchall()
    assert len(rows) == 1
    endpoint, estimated, model = rows[0]
    assert endpoint == ("messages" if "anthropic_cache" in name or "inline_system" in name
                        else "chat")
    assert estimated is True  # the captures carry no time: file mtime, flagged as estimated
    if name in MODELS:
        assert model == MODELS[name]  # read from request_body.model only


def test_capture_shapes_and_flags(con, data_dir):
    for name in FIGURES:
        ingest_usage_file_detailed(con, data_dir / "pydantic-ai" / f"{name}.jsonl")
    shapes = dict(con.execute(
        "SELECT model, any_value(usage_shape) FROM requests GROUP BY model").fetchall())
    assert shapes["claude-sonnet-4-5"] == "anthropic"
    assert shapes["gpt-4o"] == "openai"
    # OpenRouter to Gemini reports cached 2161 AND written 2161 of a 2168-token prompt
    flagged = con.execute("SELECT model, prompt_tokens, flags FROM requests "
                          "WHERE flags IS NOT NULL").fetchall()
    assert flagged == [("google/gemini-2.5-flash", 2168, "cache-exceeds-prompt")]
    # request_body holds prompt text; none of it may reach any table
    text = (data_dir / "pydantic-ai" / "test_mistral_history_uses_prompt_cache.jsonl").read_text()
    assert '"messages"' in text
    for table in ("requests", "quarantine"):
        dump = con.execute(f"SELECT * FROM {table}").df().to_csv()
        assert "content" not in dump and "role" not in dump
