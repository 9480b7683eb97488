"""Step model rule 6 (issue 11, item 11): a follow-up waits for the answer it follows.

A client can only send a conversation's next turn after the answer, so when the follow-up is
admitted every full block of the parent's prompt and fed-back output is cached: the model must
not admit it while the parent is still decoding (that predicted one block less than vLLM on
the tight-cache capture, docs/fidelity.md). Built from the real text traffic of the fidelity
tests (``tests/vllm_support.py: build_traffic``) and the bundled tokenizer."""

from __future__ import annotations

import dataclasses

from prefixscope.replay.sim import simulate
from prefixscope.replay.types import ConcurrencyConfig, SimConfig, TraceRequest
from tests.vllm_support import build_traffic


def _conversation():
    first = build_traffic(1, seed=3, max_prompt_tokens=900, max_system_chars=1600,
                          max_doc_chars=900)[0]
    output = tuple(range(1000, 1000 + 40))  # 40 generated tokens (39 fed back)
    parent = dataclasses.replace(first, request_id="p", arrival_s=0.0, output_tokens=40,
                                 output_token_ids=output)
    suffix = tuple(range(2000, 2050))
    child = TraceRequest(request_id="c", arrival_s=0.001,
                         num_prompt_tokens=len(first.prompt_token_ids) + 40 + 50,
                         prompt_token_ids=first.prompt_token_ids + output + suffix,
                         output_tokens=4, attrs={"follows": "p"})
    return parent, child


def test_a_followup_sent_during_the_parents_decode_waits_for_it():
    parent, child = _conversation()
    cc = ConcurrencyConfig(max_num_seqs=4, max_num_batched_tokens=2048,
                           enable_chunked_prefill=True, step_time_s=0.02)
    concurrent = {r.request_id: r for r in simulate(
        [parent, child], SimConfig(block_size=32, num_gpu_blocks=200, concurrency=cc))}
    sequential = {r.request_id: r for r in simulate(
        [parent, child], SimConfig(block_size=32, num_gpu_blocks=200))}
    fed_back = parent.num_prompt_tokens + 39
    assert concurrent["c"].cached_tokens == sequential["c"].cached_tokens == fed_back // 32 * 32
    # the follow-up ran after the parent finished
    assert concurrent["c"].admitted_s >= concurrent["p"].finished_s


def test_without_the_link_the_model_admits_it_at_once():
    parent, child = _conversation()
    child = dataclasses.replace(child, attrs={})
    cc = ConcurrencyConfig(max_num_seqs=4, max_num_batched_tokens=2048,
                           enable_chunked_prefill=True, step_time_s=0.02)
    got = {r.request_id: r for r in simulate(
        [parent, child], SimConfig(block_size=32, num_gpu_blocks=200, concurrency=cc))}
    assert got["c"].cached_tokens < (parent.num_prompt_tokens + 39) // 32 * 32
