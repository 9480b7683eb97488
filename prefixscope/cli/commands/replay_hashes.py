"""``prefixscope replay hashes``: vLLM's block hashes of a token-id list, one per full block."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.common import out
from prefixscope.core.documents import load_json_file
from prefixscope.core.errors import ParseError, UsageError


def read_token_ids(path: str) -> list[int]:
    """Read ``path``: a JSON list of non-negative ints (token ids).

    Raises:
        SourceUnavailable: the file cannot be read.
        ParseError: not JSON, not a list, or an element that is not an int.
    """
    value = load_json_file(path)
    if not isinstance(value, list):
        raise ParseError(path, None, "expected a JSON list of token ids", field="$")
    for i, t in enumerate(value):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ParseError(path, None, "not a non-negative integer token id", field=f"$[{i}]")
    return value


def hashes_cmd(
    tokens: Annotated[str, typer.Argument(help="JSON file holding a list of token ids.")],
    algo: Annotated[str, typer.Option(
        "--algo", help="sha256 (vLLM default), sha256_cbor, xxhash, xxhash_cbor.")] = "sha256",
    block_size: Annotated[int, typer.Option(
        "--block-size", help="Tokens per KV block (the server's block_size).")] = 16,
    salt: Annotated[str | None, typer.Option(
        "--salt", help="The request's cache_salt (enters the first block only).")] = None,
    lora_name: Annotated[str | None, typer.Option(
        "--lora-name", help="LoRA adapter name (enters every block).")] = None,
    lora_path: Annotated[str | None, typer.Option(
        "--lora-path", help="LoRA adapter path (with --lora-name).")] = None,
    seed: Annotated[str | None, typer.Option(
        "--seed", help="The server's PYTHONHASHSEED; unset: vLLM's default seeding (random "
                       "per process for xxhash).")] = None,
    as_int: Annotated[bool, typer.Option(
        "--int", help="Print the KV-events form (low 64 bits, unsigned) instead of hex.")] = False,
) -> None:
    """Print vLLM's block hash of every full block of TOKENS, one hex digest per line.

    Same values as vLLM 0.32/0.33 (chained hashes; NONE_HASH from PYTHONHASHSEED or the
    default seed). A partial last block has no hash and prints nothing.

    Example: prefixscope replay hashes --algo sha256 --block-size 16 tokens.json
    """
    from prefixscope.replay.hashing import VLLM_ALGOS, block_hashes, int_block_hash

    if algo not in VLLM_ALGOS:
        raise UsageError(f"--algo must be one of {', '.join(VLLM_ALGOS)} (got {algo!r})")
    if block_size < 1:
        raise UsageError(f"--block-size must be >= 1 (got {block_size})")
    if (lora_name is None) != (lora_path is None):
        raise UsageError("--lora-name and --lora-path go together")
    token_ids = read_token_ids(tokens)
    digests = block_hashes(
        token_ids, block_size=block_size, algo=algo, seed=seed, cache_salt=salt,
        lora_name=lora_name, lora_path=lora_path,
    )
    lines = [str(int_block_hash(d)) if as_int else d.hex() for d in digests]
    if lines:
        out.print("\n".join(lines), markup=False, highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``replay hashes``."""
    groups["replay"].command("hashes")(hashes_cmd)
