"""An instrumented ``prefixscope gateway`` for ``benchmarks/gateway.py --trace DIR``: finds what
stalls the event loop (docs/benchmarks-history.md, gateway round 5).

Run as ``python benchmarks/gateway_trace.py CONFIG OUT.json``: the gateway of ``CONFIG``
(one worker) with, in the same process,

- a **loop-lag ticker**: a callback every 1 ms on the event loop; a tick more than
  ``LAG_MS`` late is recorded with what the loop thread did meanwhile: its own CPU time
  (``time.thread_time``), the process's CPU time (all threads) and the kernel's run-queue
  wait of the loop thread (``/proc/self/task/TID/schedstat``: time runnable but not running,
  i.e. waiting for a CPU), its page faults and context switches (``getrusage``) and the machine's steal time (the
  hypervisor running something else, ``/proc/stat``, 10 ms ticks);
- **gc callbacks**: every collection (generation, duration, objects collected);
- the **log writer's** batches (start, duration of write + fsync, lines, rotations);
- **new connections**: upstream connects of the pool and accepted client connections.

Times are ``time.perf_counter()`` (CLOCK_MONOTONIC, the same clock in every process of the
machine), so the benchmark client's request spans can be matched against them. The trace is
written when the gateway stops (SIGTERM, at the end of its lifespan). Nothing here changes what the gateway does.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAG_MS = 2.0

TRACE: dict[str, list] = {"lags": [], "gc": [], "drains": [], "upstream_connects": [],
                          "accepts": []}


def _install(out: Path) -> None:
    from prefixscope.gateway import app as app_mod
    from prefixscope.gateway import logs as logs_mod
    from prefixscope.gateway import server as server_mod
    from prefixscope.gateway import upstream_client as uc

    pc = time.perf_counter

    # --- gc
    gc_start: list[float] = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = pc()
        else:
            t = pc()
            TRACE["gc"].append((gc_start[0], round((t - gc_start[0]) * 1000, 3),
                                info.get("generation"), info.get("collected")))

    tune = server_mod.tune_gc

    def tune_gc() -> None:
        tune()
        gc.callbacks.append(on_gc)

    server_mod.tune_gc = tune_gc

    # --- log writer
    drain = logs_mod.JsonlLog._drain

    def traced_drain(self) -> None:
        t0 = pc()
        n, rot = self.lines_written, self.rotations
        drain(self)
        if self.lines_written != n:
            TRACE["drains"].append((t0, round((pc() - t0) * 1000, 3), self.path.name,
                                    self.lines_written - n, self.rotations - rot))

    logs_mod.JsonlLog._drain = traced_drain

    # --- upstream connects
    acquire = uc.UpstreamPool._acquire

    async def traced_acquire(self, key):
        before = self._open
        t0 = pc()
        conn = await acquire(self, key)
        if self._open != before:
            TRACE["upstream_connects"].append((t0, round((pc() - t0) * 1000, 3), self._open))
        return conn

    uc.UpstreamPool._acquire = traced_acquire

    # --- accepted client connections (uvicorn's httptools protocol)
    try:
        from uvicorn.protocols.http import httptools_impl

        made = httptools_impl.HttpToolsProtocol.connection_made

        def traced_made(self, transport):
            TRACE["accepts"].append(pc())
            return made(self, transport)

        httptools_impl.HttpToolsProtocol.connection_made = traced_made
    except ImportError:  # pragma: no cover
        pass

    # --- the loop-lag ticker, started with the gateway
    start = app_mod.Gateway.start

    async def traced_start(self) -> None:
        await start(self)
        loop = asyncio.get_running_loop()
        tid = threading.get_native_id()
        fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)

        def sched() -> tuple[int, int]:
            on_cpu, waiting, _ = os.pread(fd, 128, 0).split()
            return int(on_cpu), int(waiting)

        def ru() -> tuple[int, int, int, int]:
            r = resource.getrusage(resource.RUSAGE_THREAD)
            return r.ru_majflt, r.ru_minflt, r.ru_nvcsw, r.ru_nivcsw

        stat_fd = os.open("/proc/stat", os.O_RDONLY)

        def steal() -> int:  # the machine's steal time (hypervisor), USER_HZ ticks
            return int(os.pread(stat_fd, 256, 0).split(b"\n", 1)[0].split()[8])

        state = {"st": steal(), "t": pc(), "th": time.thread_time(), "pr": time.process_time(),
                 "sc": sched(), "gc": 0, "ru": ru()}

        def tick() -> None:
            now = pc()
            th, pr, sc, u, st = time.thread_time(), time.process_time(), sched(), ru(), steal()
            lag = (now - state["t"] - 0.001) * 1000
            if lag > LAG_MS:
                TRACE["lags"].append({
                    "t": state["t"], "lag_ms": round(lag, 3),
                    "loop_cpu_ms": round((th - state["th"]) * 1000, 3),
                    "proc_cpu_ms": round((pr - state["pr"]) * 1000, 3),
                    "runqueue_wait_ms": round((sc[1] - state["sc"][1]) / 1e6, 3),
                    "gc_during": len(TRACE["gc"]) - state["gc"],
                    # the loop thread's page faults (major: read from disk) and context
                    # switches (voluntary: it blocked, e.g. on the GIL or a fault; involuntary:
                    # preempted)
                    "major_faults": u[0] - state["ru"][0], "minor_faults": u[1] - state["ru"][1],
                    "voluntary_switches": u[2] - state["ru"][2],
                    "involuntary_switches": u[3] - state["ru"][3],
                    "steal_ticks": st - state["st"]})
            state.update(t=now, th=th, pr=pr, sc=sc, gc=len(TRACE["gc"]), ru=u, st=st)
            loop.call_later(0.001, tick)

        loop.call_later(0.001, tick)

    app_mod.Gateway.start = traced_start

    def dump() -> None:
        out.write_text(json.dumps(TRACE))

    stop = app_mod.Gateway.stop

    async def traced_stop(self) -> None:  # uvicorn re-raises SIGTERM after the lifespan ends
        await stop(self)
        dump()

    app_mod.Gateway.stop = traced_stop


def main() -> None:
    config, out = sys.argv[1], Path(sys.argv[2])
    _install(out)
    from prefixscope.gateway.config import load_gateway_config
    from prefixscope.gateway.server import serve

    serve(load_gateway_config(config))


if __name__ == "__main__":
    main()
