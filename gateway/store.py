"""Acceptance registry, generation state and the CacheUsePermit gate.

Two implementations of one interface (:class:`AcceptanceStore`):

- :class:`MemoryStore`: one gateway. The authorization epochs and permits are
  ``prefixscope.core.identity.AuthorizationGate`` (one lock: a revocation and a permit
  acquisition are linearised, exactly one of two racing at the same epoch wins). With
  ``state_file`` the generation state (cache epoch, authorization epochs, public stop,
  bypass) and the registry are saved (atomic replace + fsync) on every admin change and at
  shutdown, and loaded at start: a restart never re-enables an old generation.
- :class:`RedisStore`: several replicas. Every state change and every permit is one Lua
  script, which Redis runs atomically: the compare-and-set of a revocation and the epoch check
  of a permit are linearised by the server (``docs/deploy.md#several-gateway-replicas``).

State (``cache-identity.md``): ``cache_epoch`` (only grows), per namespace the authorization
epoch (only grows, by compare-and-set), ``public_stopped`` (one-way), ``bypass`` (turning it
off advances the cache epoch, so nothing written before the bypass is used again), the
registry (lookup key -> the identity an object was last written under) and cache handles.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from prefixscope.core.documents import load_config_file, parse_json
from prefixscope.core.errors import ConfigError
from prefixscope.core.identity import AuthorizationGate, CacheIdentity

INITIAL_EPOCH = 1
#: Largest state file read at start, bytes: a registry entry is about 400 bytes without block
#: hashes, so 1 GiB holds the default 1,000,000 entries with room for their hash chains; a
#: larger file (or one that is not a regular file, not UTF-8, not JSON or nested too deep) is
#: refused and the gateway does not start: it never starts with epochs older than it saved.
STATE_FILE_MAX_BYTES = 1 << 30

try:
    from redis.exceptions import RedisError
except ImportError:  # pragma: no cover - redis is a dependency
    RedisError = OSError  # type: ignore[misc,assignment]

#: What a failing shared store raises (the gateway then fails closed: no cached KV).
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)


@dataclass(frozen=True, slots=True)
class StoredObject:
    """A registry entry: the identity it was written under, its tokens (an upper bound: the
    writer's prompt tokens), the writer's request id, the handle a client may present and,
    when the gateway tokenizes (``tokenize = "upstream"``), the block-hash chain of the
    writer's prompt (``gateway/tokens.py``)."""

    identity: CacheIdentity
    num_tokens: int
    request_id: str
    handle: str
    blocks: bytes = b""  # the writer's prompt as a chain of 8-byte block hashes (tokenize on)

    def to_json(self) -> str:
        d = {"identity": asdict(self.identity), "num_tokens": self.num_tokens,
             "request_id": self.request_id, "handle": self.handle}
        if self.blocks:
            d["blocks"] = self.blocks.hex()
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> StoredObject:
        d = json.loads(text)
        return cls(CacheIdentity(**d["identity"]), int(d["num_tokens"]), d["request_id"],
                   d["handle"], bytes.fromhex(d.get("blocks", "")))


@dataclass(frozen=True, slots=True)
class Generation:
    """The global generation state read at the start of each request."""

    cache_epoch: int
    public_stopped: bool
    bypass: bool


class AcceptanceStore(Protocol):
    """What the gateway needs from its shared state (all methods are coroutines)."""

    async def generation(self) -> Generation: ...
    async def auth_epoch(self, namespace: str) -> int: ...
    async def lookup(self, keys: list[bytes]) -> list[StoredObject | None]: ...
    async def by_handle(self, handle: str) -> StoredObject | None: ...
    async def snapshot(self, namespace: str, keys: list[bytes]
                       ) -> tuple[Generation, int, list[StoredObject | None]]: ...
    async def finish(self, release: bool, items: list[tuple[bytes, StoredObject]],
                     forget: list[tuple[bytes, str]] = ()) -> None: ...
    async def forget(self, items: list[tuple[bytes, str]]) -> int: ...
    async def put(self, items: list[tuple[bytes, StoredObject]]) -> None: ...
    async def acquire_permit(self, namespace: str, epoch: int) -> bool: ...
    async def release_permit(self) -> None: ...
    async def permits_in_flight(self) -> int: ...
    async def revoke(self, namespace: str, from_epoch: int | None = None) -> int | None: ...
    async def bump_cache_epoch(self) -> int: ...
    async def stop_public(self) -> None: ...
    async def set_bypass(self, on: bool) -> int: ...
    async def close(self) -> None: ...


class MemoryStore:
    """In-process state for one gateway (module docstring)."""

    def __init__(self, state_file: str | None = None, *, max_entries: int = 1_000_000) -> None:
        self.gate = AuthorizationGate(initial_epoch=INITIAL_EPOCH, keep_log=False)
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self.cache_epoch = INITIAL_EPOCH
        self.public_stopped = False
        self.bypass = False
        # least recently written first; beyond max_entries the oldest are forgotten (a later
        # request for them is a miss: the salts, not the registry, keep tenants apart)
        self.registry: OrderedDict[bytes, StoredObject] = OrderedDict()
        self.handles: dict[str, bytes] = {}
        self.in_flight = 0
        self.state_file = state_file
        if state_file and os.path.lexists(state_file):  # a missing file: a first start
            self._load(Path(state_file))

    # ---- persistence
    def _load(self, path: Path) -> None:
        """Load the state :meth:`save` wrote.

        Raises:
            SourceUnavailable: not a regular file (a FIFO, a device, a folder) or unreadable
                (exit 3).
            ConfigError: larger than :data:`STATE_FILE_MAX_BYTES`, not UTF-8, not JSON, nested
                too deep, or not the shape :meth:`save` writes (``file: reason``, exit 2).
        """
        d = load_config_file(path, what="gateway state file", parse=parse_json,
                             limit=STATE_FILE_MAX_BYTES)
        try:
            if not isinstance(d, dict):
                raise TypeError("not a JSON object")
            cache_epoch = int(d["cache_epoch"])
            epochs = {str(k): int(v) for k, v in d.get("auth_epochs", {}).items()}
            registry: OrderedDict[bytes, StoredObject] = OrderedDict()
            handles: dict[str, bytes] = {}
            for hexkey, obj in d.get("registry", {}).items():
                o = StoredObject.from_json(obj)
                key = bytes.fromhex(hexkey)
                registry[key] = o
                handles[o.handle] = key
        except KeyError as exc:
            raise ConfigError(f"{path}: not a gateway state file: no {exc.args[0]}") from None
        except RecursionError:  # a registry entry is JSON text of its own
            raise ConfigError(f"{path}: not a gateway state file: an entry is nested too "
                              "deep") from None
        except (TypeError, ValueError, AttributeError):  # the values are never echoed
            raise ConfigError(f"{path}: not a gateway state file: a value of the wrong type "
                              "or form") from None
        self.cache_epoch = cache_epoch
        self.public_stopped = bool(d.get("public_stopped"))
        self.bypass = bool(d.get("bypass"))
        self.gate._epochs.update(epochs)
        self.registry, self.handles = registry, handles

    def save(self) -> None:
        """Write the state file (atomic replace, fsync); no-op without ``state_file``."""
        if not self.state_file:
            return
        with self._lock, self.gate._lock:
            d = {"cache_epoch": self.cache_epoch, "public_stopped": self.public_stopped,
                 "bypass": self.bypass, "auth_epochs": dict(self.gate._epochs),
                 "registry": {k.hex(): o.to_json() for k, o in self.registry.items()}}
        path = Path(self.state_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(d, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    # ---- reads
    async def generation(self) -> Generation:
        return Generation(self.cache_epoch, self.public_stopped, self.bypass)

    async def auth_epoch(self, namespace: str) -> int:
        return self.gate.current(namespace)

    async def lookup(self, keys: list[bytes]) -> list[StoredObject | None]:
        return [self.registry.get(k) for k in keys]

    async def by_handle(self, handle: str) -> StoredObject | None:
        k = self.handles.get(handle)
        return None if k is None else self.registry.get(k)

    async def snapshot(self, namespace: str, keys: list[bytes]
                       ) -> tuple[Generation, int, list[StoredObject | None]]:
        """:meth:`generation`, :meth:`auth_epoch` and :meth:`lookup` at once."""
        return (Generation(self.cache_epoch, self.public_stopped, self.bypass),
                self.gate.current(namespace), [self.registry.get(k) for k in keys])

    async def finish(self, release: bool, items: list[tuple[bytes, StoredObject]],
                     forget: list[tuple[bytes, str]] = ()) -> None:
        """:meth:`release_permit` (when ``release``), :meth:`forget` and :meth:`put` at once."""
        if release:
            await self.release_permit()
        if forget:
            await self.forget(list(forget))
        if items:
            await self.put(items)

    async def forget(self, items: list[tuple[bytes, str]]) -> int:
        """Delete the entry at each ``(key, writer request id)`` whose current entry is still
        that writer's (a compare-and-delete: an entry written since stays). Returns how many
        were deleted. A forgotten entry only makes a later request a miss."""
        n = 0
        with self._lock:
            for k, rid in items:
                old = self.registry.get(k)
                if old is not None and old.request_id == rid:
                    del self.registry[k]
                    self.handles.pop(old.handle, None)
                    n += 1
        return n

    async def put(self, items: list[tuple[bytes, StoredObject]]) -> None:
        with self._lock:
            for k, obj in items:
                old = self.registry.get(k)
                if old is not None:
                    self.handles.pop(old.handle, None)
                self.registry[k] = obj
                self.registry.move_to_end(k)
                self.handles[obj.handle] = k
            while len(self.registry) > self.max_entries:
                _, old = self.registry.popitem(last=False)
                self.handles.pop(old.handle, None)

    # ---- the gate
    async def acquire_permit(self, namespace: str, epoch: int) -> bool:
        return self.acquire_permit_sync(namespace, epoch)

    def acquire_permit_sync(self, namespace: str, epoch: int) -> bool:
        """The permit (thread-safe): the core gate's check, then one more permit in flight."""
        with self.gate._lock:
            ok = self.gate._epochs.get(namespace, self.gate.initial_epoch) == epoch
            self.gate._record("permit", namespace, epoch, ok)
            if ok:
                self.in_flight += 1
            return ok

    async def release_permit(self) -> None:
        with self.gate._lock:
            assert self.in_flight > 0, "permit released twice"
            self.in_flight -= 1

    async def permits_in_flight(self) -> int:
        return self.in_flight

    async def revoke(self, namespace: str, from_epoch: int | None = None) -> int | None:
        new = self.revoke_sync(namespace, from_epoch)
        self.save()
        return new

    def revoke_sync(self, namespace: str, from_epoch: int | None = None) -> int | None:
        """Compare-and-set revocation (thread-safe): ``AuthorizationGate.revoke``."""
        return self.gate.revoke(namespace, from_epoch=from_epoch)

    # ---- admin
    async def bump_cache_epoch(self) -> int:
        with self._lock:
            self.cache_epoch += 1
            new = self.cache_epoch
        self.save()
        return new

    async def stop_public(self) -> None:
        self.public_stopped = True
        self.save()

    async def set_bypass(self, on: bool) -> int:
        with self._lock:
            if self.bypass and not on:
                self.cache_epoch += 1  # nothing written before the bypass is used again
            self.bypass = on
            epoch = self.cache_epoch
        self.save()
        return epoch

    async def close(self) -> None:
        self.save()


# --------------------------------------------------------------------------- Redis

_ACQUIRE = """
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or ARGV[3])
if cur == tonumber(ARGV[2]) then
  redis.call('INCR', KEYS[2])
  return 1
end
return 0
"""
_REVOKE = """
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or ARGV[3])
if ARGV[2] ~= '' and cur ~= tonumber(ARGV[2]) then
  return -1
end
redis.call('HSET', KEYS[1], ARGV[1], cur + 1)
return cur + 1
"""
_BUMP = """
local cur = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
redis.call('SET', KEYS[1], cur + 1)
return cur + 1
"""
_BYPASS = """
local cur = tonumber(redis.call('GET', KEYS[1]) or ARGV[2])
local was = redis.call('GET', KEYS[2])
if was == '1' and ARGV[1] == '0' then
  cur = cur + 1
  redis.call('SET', KEYS[1], cur)
end
redis.call('SET', KEYS[2], ARGV[1])
return cur
"""
_PUT = """
for i = 1, #KEYS do
  local old = redis.call('GET', KEYS[i])
  if old then
    local h = cjson.decode(old)['handle']
    redis.call('DEL', ARGV[2 * #KEYS + 1] .. h)
  end
  redis.call('SET', KEYS[i], ARGV[i], 'EX', ARGV[2 * #KEYS + 2])
  redis.call('SET', ARGV[2 * #KEYS + 1] .. ARGV[#KEYS + i], KEYS[i], 'EX', ARGV[2 * #KEYS + 2])
end
return #KEYS
"""

_FORGET = """
local n = 0
for i = 1, #KEYS do
  local old = redis.call('GET', KEYS[i])
  if old then
    local o = cjson.decode(old)
    if o['request_id'] == ARGV[i] then
      redis.call('DEL', KEYS[i])
      redis.call('DEL', ARGV[#KEYS + 1] .. o['handle'])
      n = n + 1
    end
  end
end
return n
"""


class RedisStore:
    """Shared state for several gateway replicas in one Redis (module docstring).

    Keys (prefix ``prefixscope:gw:`` unless given): ``cache_epoch``, ``public_stopped``,
    ``bypass`` (strings), ``auth_epochs`` (hash namespace -> epoch), ``permits`` (counter of
    permits in flight), ``reg:<lookup key hex>`` (a :class:`StoredObject` as JSON) and
    ``handle:<handle>`` (its lookup key), both expiring ``entry_ttl_s`` after their last write
    (an expired entry only turns a later request into a miss). Raw tenant ids are never stored:
    namespaces are HMACs.
    """

    def __init__(self, url: str, prefix: str = "prefixscope:gw:", *,
                 entry_ttl_s: int = 7 * 86400) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.entry_ttl_s = entry_ttl_s
        self.p = prefix
        self.r = aioredis.from_url(url, decode_responses=False)
        self._acquire = self.r.register_script(_ACQUIRE)
        self._revoke = self.r.register_script(_REVOKE)
        self._bump = self.r.register_script(_BUMP)
        self._bypass = self.r.register_script(_BYPASS)
        self._put = self.r.register_script(_PUT)
        self._forget = self.r.register_script(_FORGET)

    async def generation(self) -> Generation:
        ce, ps, bp = await self.r.mget(self.p + "cache_epoch", self.p + "public_stopped",
                                       self.p + "bypass")
        return Generation(int(ce) if ce else INITIAL_EPOCH, ps == b"1", bp == b"1")

    async def auth_epoch(self, namespace: str) -> int:
        v = await self.r.hget(self.p + "auth_epochs", namespace)
        return int(v) if v else INITIAL_EPOCH

    async def lookup(self, keys: list[bytes]) -> list[StoredObject | None]:
        if not keys:
            return []
        vals = await self.r.mget([self.p + "reg:" + k.hex() for k in keys])
        return [None if v is None else StoredObject.from_json(v) for v in vals]

    async def snapshot(self, namespace: str, keys: list[bytes]
                       ) -> tuple[Generation, int, list[StoredObject | None]]:
        """:meth:`generation`, :meth:`auth_epoch` and :meth:`lookup` in one round trip (a
        pipeline; reads only: the permit script stays the linearisation point)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.mget(self.p + "cache_epoch", self.p + "public_stopped", self.p + "bypass")
        pipe.hget(self.p + "auth_epochs", namespace)
        if keys:
            pipe.mget([self.p + "reg:" + k.hex() for k in keys])
        res = await pipe.execute()
        ce, ps, bp = res[0]
        found = [None if v is None else StoredObject.from_json(v) for v in res[2]] if keys else []
        return (Generation(int(ce) if ce else INITIAL_EPOCH, ps == b"1", bp == b"1"),
                int(res[1]) if res[1] else INITIAL_EPOCH, found)

    async def finish(self, release: bool, items: list[tuple[bytes, StoredObject]],
                     forget: list[tuple[bytes, str]] = ()) -> None:
        """:meth:`release_permit` (when ``release``) and :meth:`put` in one round trip;
        :meth:`forget` first (a rejected request: it holds no permit and puts nothing)."""
        if forget:
            await self.forget(list(forget))
        if not release:
            await self.put(items)
            return
        if not items:
            await self.release_permit()
            return
        pipe = self.r.pipeline(transaction=False)
        pipe.decr(self.p + "permits")
        keys = [self.p + "reg:" + k.hex() for k, _ in items]
        args = [o.to_json() for _, o in items] + [o.handle for _, o in items] + [
            self.p + "handle:", self.entry_ttl_s]
        await self._put(keys=keys, args=args, client=pipe)  # queued on the pipeline
        await pipe.execute()

    async def by_handle(self, handle: str) -> StoredObject | None:
        k = await self.r.get(self.p + "handle:" + handle)
        if k is None:
            return None
        v = await self.r.get(k)
        return None if v is None else StoredObject.from_json(v)

    async def forget(self, items: list[tuple[bytes, str]]) -> int:
        """:meth:`MemoryStore.forget` as one Lua script (atomic compare-and-delete)."""
        if not items:
            return 0
        keys = [self.p + "reg:" + k.hex() for k, _ in items]
        return int(await self._forget(keys=keys, args=[rid for _, rid in items] + [
            self.p + "handle:"]))

    async def put(self, items: list[tuple[bytes, StoredObject]]) -> None:
        if not items:
            return
        keys = [self.p + "reg:" + k.hex() for k, _ in items]
        args = [o.to_json() for _, o in items] + [o.handle for _, o in items] + [
            self.p + "handle:", self.entry_ttl_s]
        await self._put(keys=keys, args=args)

    async def acquire_permit(self, namespace: str, epoch: int) -> bool:
        ok = await self._acquire(keys=[self.p + "auth_epochs", self.p + "permits"],
                                 args=[namespace, epoch, INITIAL_EPOCH])
        return int(ok) == 1

    async def release_permit(self) -> None:
        await self.r.decr(self.p + "permits")

    async def permits_in_flight(self) -> int:
        v = await self.r.get(self.p + "permits")
        return int(v) if v else 0

    async def revoke(self, namespace: str, from_epoch: int | None = None) -> int | None:
        new = await self._revoke(keys=[self.p + "auth_epochs"],
                                 args=[namespace, "" if from_epoch is None else from_epoch,
                                       INITIAL_EPOCH])
        return None if int(new) < 0 else int(new)

    async def bump_cache_epoch(self) -> int:
        return int(await self._bump(keys=[self.p + "cache_epoch"], args=[INITIAL_EPOCH]))

    async def stop_public(self) -> None:
        await self.r.set(self.p + "public_stopped", "1")

    async def set_bypass(self, on: bool) -> int:
        return int(await self._bypass(keys=[self.p + "cache_epoch", self.p + "bypass"],
                                      args=["1" if on else "0", INITIAL_EPOCH]))

    async def close(self) -> None:
        await self.r.aclose()


def open_store(spec: str, state_file: str | None = None, *, max_entries: int = 1_000_000,
               entry_ttl_s: int = 7 * 86400) -> MemoryStore | RedisStore:
    """``memory`` -> :class:`MemoryStore` (at most ``max_entries`` registry entries);
    ``redis://...`` / ``rediss://...`` / ``unix://...`` -> :class:`RedisStore` (entries expire
    ``entry_ttl_s`` seconds after their last write)."""
    if spec == "memory":
        return MemoryStore(state_file, max_entries=max_entries)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(spec, entry_ttl_s=entry_ttl_s)
    from prefixscope.core.errors import ConfigError

    raise ConfigError(f"[gateway] store: expected 'memory' or a redis:// URL, got {spec[:40]!r}")


__all__ = ["AcceptanceStore", "Generation", "MemoryStore", "RedisStore", "StoredObject",
           "open_store"]
