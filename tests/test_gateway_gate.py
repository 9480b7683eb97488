"""The CacheUsePermit gate against revocations, in-process and in a real redis-server: of a
revocation from epoch e and a permit asked for at e, racing, exactly one wins (never both), run
many times; epochs only grow; registry entries and handles are shared between replicas."""

from __future__ import annotations

import asyncio

import pytest

from prefixscope.core.identity import CacheIdentity
from prefixscope.gateway.store import MemoryStore, RedisStore, StoredObject
from tests.gateway_support import RedisServer

NS = "a" * 64
TRIALS = 300


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


async def _race(make_store, trials: int) -> list[tuple[bool, int]]:
    """Per trial: a fresh namespace at epoch 1; a permit at 1 and a revocation from 1 start
    together (on separate connections for Redis). Returns (permit ok, epoch after)."""
    a, b = make_store(), make_store()
    out = []
    try:
        for i in range(trials):
            ns = f"{i:064x}"
            permit, revoked = await asyncio.gather(a.acquire_permit(ns, 1), b.revoke(ns, 1))
            after_permit = await a.acquire_permit(ns, 1)  # never again at the old epoch
            out.append((permit, revoked, after_permit, await a.auth_epoch(ns)))
            if permit:
                await a.release_permit()
    finally:
        await a.close()
        if b is not a:
            await b.close()
    return out


def _check(results):
    for _permit, revoked, after, epoch in results:
        assert revoked == 2 and epoch == 2          # the revocation always commits (CAS from 1)
        assert after is False                       # no permit at the old epoch after it
    assert len(results) == TRIALS


def test_memory_gate_race_never_both_in_threads():
    import threading

    store = MemoryStore()
    for i in range(TRIALS):
        ns = f"{i:064x}"
        res = {}
        barrier = threading.Barrier(2)

        def permit(ns=ns, res=res, barrier=barrier):
            barrier.wait()
            res["permit"] = store.acquire_permit_sync(ns, 1)

        def revoke(ns=ns, res=res, barrier=barrier):
            barrier.wait()
            res["revoke"] = store.revoke_sync(ns, 1)

        ts = [threading.Thread(target=permit), threading.Thread(target=revoke)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert res["revoke"] == 2
        assert store.acquire_permit_sync(ns, 1) is False
        if res["permit"]:
            asyncio.run(store.release_permit())
    assert store.in_flight == 0


def test_redis_gate_race_never_both(redis_server):
    results = asyncio.run(_race(lambda: RedisStore(redis_server.url, prefix="t1:"), TRIALS))
    _check(results)
    assert asyncio.run(_in_flight(redis_server.url, "t1:")) == 0


async def _in_flight(url, prefix):
    s = RedisStore(url, prefix=prefix)
    try:
        return await s.permits_in_flight()
    finally:
        await s.close()


def test_redis_state_is_shared_and_only_grows(redis_server):
    async def run():
        a, b = RedisStore(redis_server.url, prefix="t2:"), RedisStore(redis_server.url, prefix="t2:")
        try:
            assert (await a.generation()).cache_epoch == 1
            assert await b.bump_cache_epoch() == 2
            assert (await a.generation()).cache_epoch == 2
            assert await a.revoke(NS, 1) == 2
            assert await b.revoke(NS, 1) is None          # compare-and-set: it moved
            assert await b.auth_epoch(NS) == 2
            assert await a.set_bypass(True) == 2
            assert await b.set_bypass(False) == 3          # off advances the cache epoch
            await a.stop_public()
            assert (await b.generation()).public_stopped
            ident = CacheIdentity("TENANT", NS, *["d"] * 7, 1, 2, 3)
            key = b"k" * 16
            await a.put([(key, StoredObject(ident, 99, "gw-1", "h-1"))])
            got = (await b.lookup([key, b"x" * 16]))
            assert got[0] == StoredObject(ident, 99, "gw-1", "h-1") and got[1] is None
            assert await b.by_handle("h-1") == got[0]
            await b.put([(key, StoredObject(ident, 5, "gw-2", "h-2"))])
            assert await a.by_handle("h-1") is None and (await a.by_handle("h-2")).num_tokens == 5
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())


def test_memory_registry_is_bounded():
    s = MemoryStore(max_entries=3)
    ident = CacheIdentity("TENANT", NS, *["d"] * 7, 1, 1, 1)

    async def run():
        for i in range(5):
            await s.put([(bytes([i]) * 16, StoredObject(ident, i, f"gw-{i}", f"h-{i}"))])
        return await s.lookup([bytes([i]) * 16 for i in range(5)]), await s.by_handle("h-0")

    found, old = asyncio.run(run())
    assert [o is not None for o in found] == [False, False, True, True, True] and old is None
    assert len(s.handles) == 3


def test_redis_entries_expire(redis_server):
    async def run():
        s = RedisStore(redis_server.url, prefix="t3:", entry_ttl_s=3600)
        try:
            ident = CacheIdentity("TENANT", NS, *["d"] * 7, 1, 1, 1)
            await s.put([(b"k" * 16, StoredObject(ident, 1, "gw-1", "h-1"))])
            return (await s.r.ttl("t3:reg:" + (b"k" * 16).hex()), await s.r.ttl("t3:handle:h-1"))
        finally:
            await s.close()

    ttl_reg, ttl_handle = asyncio.run(run())
    assert 3500 < ttl_reg <= 3600 and 3500 < ttl_handle <= 3600


def test_memory_state_file_survives_a_restart(tmp_path):
    path = str(tmp_path / "state.json")

    async def first():
        s = MemoryStore(path)
        await s.bump_cache_epoch()
        await s.revoke(NS)
        ident = CacheIdentity("TENANT", NS, *["d"] * 7, 1, 2, 2)
        await s.put([(b"k" * 16, StoredObject(ident, 7, "gw-1", "h-1"))])
        await s.close()

    async def second():
        s = MemoryStore(path)
        assert (await s.generation()).cache_epoch == 2
        assert await s.auth_epoch(NS) == 2
        assert (await s.by_handle("h-1")).num_tokens == 7

    asyncio.run(first())
    asyncio.run(second())


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_forget_deletes_only_the_writer_it_was_told(redis_server, kind):
    """``forget`` (what a rejected request does to the mismatching entries it found) is a
    compare-and-delete on the writer's request id, the same in both stores: the entry of the
    named writer goes with its handle; an entry written since by another request stays."""
    async def run():
        s = MemoryStore() if kind == "memory" else RedisStore(redis_server.url, prefix="t4:")
        try:
            old = CacheIdentity("TENANT", NS, *["d"] * 7, 1, 1, 1)
            new = CacheIdentity("TENANT", NS, *["d"] * 7, 1, 2, 2)
            k1, k2 = b"1" * 16, b"2" * 16
            await s.put([(k1, StoredObject(old, 5, "gw-1", "h-1")),
                         (k2, StoredObject(old, 5, "gw-2", "h-2"))])
            await s.put([(k2, StoredObject(new, 6, "gw-3", "h-2"))])  # rewritten since
            await s.finish(False, [], [(k1, "gw-1"), (k2, "gw-2")])
            found = await s.lookup([k1, k2])
            return (found[0], found[1].request_id, found[1].identity,
                    await s.by_handle("h-1"), (await s.by_handle("h-2")).request_id,
                    await s.forget([(k2, "gw-3")]), await s.lookup([k2]))
        finally:
            await s.close()

    gone, kept_rid, kept_ident, h1, h2_rid, n, after = asyncio.run(run())
    assert gone is None and h1 is None
    assert kept_rid == "gw-3" and kept_ident.cache_epoch == 2 and h2_rid == "gw-3"
    assert n == 1 and after == [None]
