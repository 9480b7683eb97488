"""Routing policies for fleet replay: which replica serves each request.

Each router sees the requests in trace order and picks an instance index in ``0 .. N-1``
through :meth:`Router.choose`, given a :class:`FleetView` of the instances' caches and loads.
Policies (:data:`ROUTERS`):

``round-robin``
    request k goes to instance ``k mod N`` (a Kubernetes Service, a plain load balancer).
``random``
    uniformly at random, ``random.Random(seed)`` (reproducible).
``session``
    conversation affinity: the first request of a conversation (``attrs["conversation"]``, which
    the chat, token-ids, Mooncake/Bailian (``chat_id``) and kv-cache-tester readers fill) is
    placed round robin over new conversations, later ones stick to it; requests without a
    conversation id go round robin.
``hash-prefix``
    consistent hash (a ring of :data:`RING_POINTS` points per instance) of the key of block
    ``min(K, full blocks) - 1``, which names the first ``K`` blocks (chained keys); prompts
    shorter than one block hash their tokens.
``longest-prefix``
    the instance whose cache holds the longest prefix of the request's lookup keys (at arrival,
    read from each instance's block map, as llm-d's precise prefix-cache scorer reads the
    engines' KV events); ties go to the instance with the fewest requests so far, then the lowest
    index.
``longest-prefix-bounded``
    the same among the instances within a load bound (consistent hashing with bounded loads,
    Mirrokni, Thorup and Zadimoghaddam 2018): an instance is a candidate while its load plus this
    request is at most ``ceil(load_factor x (L + 1) / N)``, ``L`` the fleet's load; ties by lower
    load, then index. Load = requests routed to the instance whose arrival is within the last
    ``load_window_s`` seconds of trace time: sequential replay has no requests in flight, so the
    requests of a recent window stand in for them (a trace without times has every arrival at 0,
    and the window then holds the whole trace: the bound then balances the totals). The least
    loaded instance always qualifies.
``recorded``
    the instance the trace names (``attrs["instance"]``: the token-ids and chat readers'
    ``instance`` field); names are numbered in order of first appearance.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections import deque
from collections.abc import Hashable, Sequence
from itertools import islice

from prefixscope.core.errors import SimulationError, UsageError
from prefixscope.replay.kv_cache_manager import SimRequest
from prefixscope.replay.types import TraceRequest

#: Policy names, in the order ``replay fleet`` prints them.
ROUTERS = ("round-robin", "random", "session", "hash-prefix", "longest-prefix",
           "longest-prefix-bounded", "recorded")
#: Points per instance on the consistent-hash ring.
RING_POINTS = 64


class FleetView:
    """What routers may read: each instance's block map and the routing history.

    Attributes:
        maps: per instance, the block pool's key -> block map (``BlockPool._first``).
        requests: per instance, requests routed so far.
        prompt_tokens: per instance, prompt tokens routed so far.
    """

    def __init__(self, maps: Sequence[dict], block_size: int) -> None:
        self.maps = list(maps)
        self.block_size = block_size
        self.requests = [0] * len(maps)
        self.prompt_tokens = [0] * len(maps)

    @property
    def num_instances(self) -> int:
        """N."""
        return len(self.maps)

    def prefix_blocks(self, instance: int, req: SimRequest) -> int:
        """Blocks of ``req``'s longest cached prefix on ``instance`` (vLLM's lookup rule: at most
        ``floor((P - 1) / B)`` keys, stop at the first key not cached)."""
        n = 0
        get = self.maps[instance].get
        for b in map(get, islice(req.block_keys, (req.num_prompt_tokens - 1) // self.block_size)):
            if b is None:
                break
            n += 1
        return n

    def routed(self, instance: int, tr: TraceRequest) -> None:
        """Record that ``tr`` went to ``instance``."""
        self.requests[instance] += 1
        self.prompt_tokens[instance] += tr.num_prompt_tokens


class Router:
    """Base class: ``choose`` returns the instance for the next request (trace order)."""

    name = ""

    def __init__(self, view: FleetView) -> None:
        self.view = view
        self.n = view.num_instances

    def choose(self, tr: TraceRequest, req: SimRequest) -> int:  # pragma: no cover - abstract
        """The instance index for ``tr`` (``req``: its keys computed)."""
        raise NotImplementedError


class RoundRobin(Router):
    """``round-robin``: request k to instance k mod N."""

    name = "round-robin"

    def __init__(self, view: FleetView) -> None:
        super().__init__(view)
        self.k = 0

    def choose(self, tr: TraceRequest, req: SimRequest) -> int:
        i = self.k % self.n
        self.k += 1
        return i


class RandomRouter(Router):
    """``random``: uniform, seeded."""

    name = "random"

    def __init__(self, view: FleetView, seed: int = 0) -> None:
        super().__init__(view)
        self.rng = random.Random(seed)

    def choose(self, tr: TraceRequest, req: SimRequest) -> int:
        return self.rng.randrange(self.n)


class SessionRouter(Router):
    """``session``: sticky per conversation id; new conversations round robin."""

    name = "session"

    def __init__(self, view: FleetView) -> None:
        super().__init__(view)
        self.sticky: dict[str, int] = {}
        self.k = 0

    def choose(self, tr: TraceRequest, req: SimRequest) -> int:
        conv = tr.attrs.get("conversation") or tr.attrs.get("session") if tr.attrs else None
        if conv is not None and conv in self.sticky:
            return self.sticky[conv]
        i = self.k % self.n
        self.k += 1
        if conv is not None:
            self.sticky[conv] = i
        return i


def stable_hash(key: Hashable) -> int:
    """A 64-bit hash of a block key that is the same in every process (Python's ``hash`` of
    bytes and str changes per process): digests use their first 8 bytes, ints themselves,
    anything else the SHA-256 of its ``repr``."""
    if isinstance(key, bytes):
        if len(key) >= 8:
            return int.from_bytes(key[:8], "big")
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    if isinstance(key, int):
        return key & ((1 << 64) - 1)
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "big")


class HashPrefix(Router):
    """``hash-prefix``: consistent hash of the first ``prefix_blocks`` blocks."""

    name = "hash-prefix"

    def __init__(self, view: FleetView, prefix_blocks: int = 4) -> None:
        super().__init__(view)
        if prefix_blocks < 1:
            raise UsageError("--hash-blocks must be >= 1")
        self.prefix_blocks = prefix_blocks
        ring = sorted((int.from_bytes(hashlib.sha256(f"{i}:{v}".encode()).digest()[:8], "big"), i)
                      for i in range(self.n) for v in range(RING_POINTS))
        self.points = [p for p, _ in ring]
        self.owners = [i for _, i in ring]

    def choose(self, tr: TraceRequest, req: SimRequest) -> int:
        keys = req.block_keys
        full = req.num_prompt_tokens // self.view.block_size
        if full:
            h = stable_hash(keys[min(self.prefix_blocks, full) - 1])
        elif req.prompt is not None:
            h = stable_hash(repr(tuple(req.prompt)))
        else:
            h = stable_hash(tr.request_id)
        j = bisect.bisect_left(self.points, h)
        return self.owners[j % len(self.points)]


class LongestPrefix(Router):
    """``longest-prefix``: the instance with the longest cached prefix; ties by fewest requests."""

    name = "longest-prefix"

    def choose(self, tr: TraceRequest, req: SimRequest) -> int:
        view = self.view
        best, best_key = 0, None
        for i in range(self.n):
            k = (-view.prefix_blocks(i, req), view.requests[i], i)
            if best_key is None or k < best_key:
                best, best_key = i, k
        return best


class BoundedLongestPrefix(Router):
    """``longest-prefix-bounded``: longest prefix among instances within the load bound."""

    name = "longest-prefix-bounded"

    def __init__(self, view: FleetView, load_factor: float = 1.25,
                 load_window_s: float = 60.0) -> None:
        super().__init__(view)
        if load_factor < 1.0:
            raise UsageError("--load-factor must be >= 1 (a multiple of the mean load)")
        if load_window_s <= 0:
            raise UsageError("--load-window must be > 0 seconds")
        self.load_factor = load_factor
        self.window_s = load_window_s
        self.recent: deque[tuple[float, int]] = deque()  # (arrival, instance), oldest first
        self.load = [0] * self.n
        self.bounds: list[int] = []  # bound for each total: ceil(k * (total + 1) / N)

    def bound(self, total: int) -> int:
        """Most requests an instance may hold in the window, with this request counted:
        ``ceil(load_factor * (total + 1) / N)`` (at least 1)."""
        return max(1, math.ceil(self.load_factor * (total + 1) / self.n - 1e-9))

    def choose(self, tr: TraceRequest, req: SimRequest) -> int:
        now = tr.arrival_s
        recent, load = self.recent, self.load
        while recent and recent[0][0] <= now - self.window_s:
            load[recent.popleft()[1]] -= 1
        bound = self.bound(len(recent))
        view = self.view
        best, best_key = None, None
        for i in range(self.n):
            if load[i] + 1 > bound:
                continue
            k = (-view.prefix_blocks(i, req), load[i], i)
            if best_key is None or k < best_key:
                best, best_key = i, k
        assert best is not None  # the least loaded instance holds at most the mean
        recent.append((now, best))
        load[best] += 1
        return best


class Recorded(Router):
    """``recorded``: the trace's own ``attrs["instance"]``."""

    name = "recorded"

    def __init__(self, view: FleetView, names: dict[str, int]) -> None:
        super().__init__(view)
        self.names = names

    def choose(self, tr: TraceRequest, req: SimRequest) -> int:
        name = tr.attrs.get("instance") if tr.attrs else None
        if name is None:
            raise SimulationError(
                f"request {tr.request_id} ({tr.source or 'trace'}) names no instance: the "
                "recorded router needs an 'instance' field on every request")
        i = self.names.get(name)
        if i is None:
            raise SimulationError(f"request {tr.request_id}: instance {name!r} is not among "
                                  f"the {len(self.names)} instances of the fleet")
        return i


def make_router(name: str, view: FleetView, *, seed: int = 0, hash_blocks: int = 4,
                load_factor: float = 1.25, load_window_s: float = 60.0,
                instance_names: dict[str, int] | None = None) -> Router:
    """The router called ``name`` (one of :data:`ROUTERS`) over ``view``.

    Raises:
        UsageError: unknown name, or a parameter out of range.
    """
    if name == "round-robin":
        return RoundRobin(view)
    if name == "random":
        return RandomRouter(view, seed)
    if name == "session":
        return SessionRouter(view)
    if name == "hash-prefix":
        return HashPrefix(view, hash_blocks)
    if name == "longest-prefix":
        return LongestPrefix(view)
    if name == "longest-prefix-bounded":
        return BoundedLongestPrefix(view, load_factor, load_window_s)
    if name == "recorded":
        return Recorded(view, instance_names or {})
    raise UsageError(f"unknown router {name!r}: choose from {', '.join(ROUTERS)}")
