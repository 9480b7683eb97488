"""Build the tiny byte-level BPE tokenizer shipped in ``data/tiny-tokenizer/``, entirely offline.

The same tokenizer is used by the replay (``replay/tokenization.py``, chat-request traces) and
by the tiny Llama that ``deploy/tiny_model/build_model.py`` builds for a live vLLM CPU server,
so the replay and the live server count exactly the same prompt tokens.

Recipe (``/work/shared/docs/vllm-cpu.md``, "A tiny model built locally"):

- ``tokenizers`` BPE model, byte-level pre-tokenizer (no prefix space), byte-level decoder and
  post-processor (``trim_offsets=False``), BPE trainer seeded with the byte-level alphabet;
- trained on the top-level ``*.py`` files of the Python standard library of the interpreter that
  runs this script (CPython 3.11: 168 files), in sorted path order;
- vocabulary 4096; special tokens ``<|pad|>`` (id 0), ``<|bos|>`` (1), ``<|eos|>`` (2),
  ``<|im_start|>`` (3), ``<|im_end|>`` (4); no BOS added automatically;
- the files a ``transformers.PreTrainedTokenizerFast`` loads: ``tokenizer.json``,
  ``tokenizer_config.json`` (bos/eos/pad, ``model_max_length`` 4096, the chat template),
  ``special_tokens_map.json`` and ``chat_template.jinja`` (ChatML: ``<|im_start|>`` + role +
  newline + content + ``<|im_end|>`` + newline per message; ``<|im_start|>assistant`` + newline
  as the generation prompt; an optional ``# Tools`` block in the system turn).

Usage (the shipped copy was built with CPython 3.11.7; another stdlib gives other merges)::

    python deploy/tiny_model/build_tokenizer.py --out data/tiny-tokenizer

Only ``tokenizers`` is needed; transformers is not. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "data" / "tiny-tokenizer"
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 4096

#: ChatML. Plain string messages render exactly as ``<|im_start|>ROLE\nCONTENT<|im_end|>\n``.
#: Content is used as a string (vLLM then joins text parts with a newline before rendering);
#: tools, when given, go into the system turn as one JSON object per line.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages and messages[0]['role'] == 'system' %}
{{- messages[0]['content'] + '\\n\\n' }}
{%- endif %}
{{- '# Tools\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' + (tool | tojson) }}
{%- endfor %}
{{- '\\n</tools><|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if not (tools and loop.first and message['role'] == 'system') %}
{{- '<|im_start|>' + message['role'] + '\\n' }}
{%- if message['content'] %}
{{- message['content'] }}
{%- endif %}
{%- if message['tool_calls'] %}
{%- for tool_call in message['tool_calls'] %}
{{- '\\n<tool_call>\\n' + ({'name': tool_call['function']['name'], 'arguments': tool_call['function']['arguments']} | tojson) + '\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def training_files() -> list[str]:
    """The training corpus: this interpreter's top-level stdlib ``*.py`` files, sorted."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(str(p) for p in stdlib.glob("*.py"))


def train(files: list[str]):
    """Train the BPE tokenizer on ``files``; returns a ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    return tok


def write(tok, out: Path) -> None:
    """Write the tokenizer and its transformers-compatible config files into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    added = {}
    for token in SPECIAL_TOKENS:
        added[str(tok.token_to_id(token))] = {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
    config = {
        "added_tokens_decoder": added,
        "bos_token": "<|bos|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|eos|>",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|pad|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"directory (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    files = training_files()
    if not files:
        print("error: no stdlib *.py files found to train on", file=sys.stderr)
        return 2
    tok = train(files)
    write(tok, args.out)
    print(f"wrote {args.out} (vocab {tok.get_vocab_size()}, trained on {len(files)} files)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
