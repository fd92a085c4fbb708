"""The plan builders' cache, bounded by bytes as well as by entries: a plan of T = 100,000
steps is ~1 GB of Python objects, so a count alone (128 plans) does not bound the host memory
that cached plans hold.

``plan_cache(maxsize)`` decorates a builder like ``functools.lru_cache`` (``cache_info()``,
``cache_clear()``), keeping at most ``maxsize`` plans and at most ``budget`` bytes of them by
``plan_bytes`` (ops x sizes.PLAN_OP_BYTES, the per-op bound the size checks use). Adding a
plan evicts the least recently used ones until both bounds hold; a plan larger than the whole
budget is returned but not kept. The budget: ``RNNRT_PLAN_CACHE_BYTES`` (read when the cache
is made), else DEFAULT_PLAN_CACHE_BYTES.
"""
from __future__ import annotations

import functools
import os
import threading
from collections import OrderedDict, namedtuple

from ..sizes import PLAN_OP_BYTES

DEFAULT_PLAN_CACHE_BYTES = 1 << 30
"""Host bytes a builder's cache keeps (by ``plan_bytes``): 128 plans of ~10,000 op-steps."""

CacheInfo = namedtuple("CacheInfo", "hits misses maxsize currsize nbytes budget evictions")


def plan_bytes(plan) -> int:
    """Host bytes ``plan`` holds, estimated: its ops x PLAN_OP_BYTES (views and events
    included; an upper bound, tests/plan/test_plan_cache.py measures it)."""
    return len(plan.ops) * PLAN_OP_BYTES


def _budget() -> int:
    v = os.environ.get("RNNRT_PLAN_CACHE_BYTES")
    if v is None or not v.strip():
        return DEFAULT_PLAN_CACHE_BYTES
    try:
        n = int(float(v))
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"RNNRT_PLAN_CACHE_BYTES: expected a number of bytes >= 0, got {v!r}")
    return n


def plan_cache(maxsize: int = 128, budget: int | None = None, size=plan_bytes):
    """A decorator: the builder's results cached by its arguments, least recently used out
    past ``maxsize`` entries or ``budget`` bytes (None: ``RNNRT_PLAN_CACHE_BYTES`` or the
    default) of ``size(result)``."""

    def wrap(build):
        lock = threading.Lock()
        entries: OrderedDict = OrderedDict()   # args -> (plan, bytes)
        stats = {"hits": 0, "misses": 0, "nbytes": 0, "evictions": 0,
                 "budget": _budget() if budget is None else int(budget)}

        @functools.wraps(build)
        def cached(*args, **kwargs):
            k = (args, tuple(sorted(kwargs.items()))) if kwargs else args
            with lock:
                hit = entries.get(k)
                if hit is not None:
                    entries.move_to_end(k)
                    stats["hits"] += 1
                    return hit[0]
                stats["misses"] += 1
            plan = build(*args, **kwargs)   # outside the lock: a build may take seconds
            n = int(size(plan))
            with lock:
                if n > stats["budget"] or k in entries:
                    return plan
                entries[k] = (plan, n)
                stats["nbytes"] += n
                while len(entries) > maxsize or stats["nbytes"] > stats["budget"]:
                    _, (_, old) = entries.popitem(last=False)
                    stats["nbytes"] -= old
                    stats["evictions"] += 1
            return plan

        def cache_info() -> CacheInfo:
            with lock:
                return CacheInfo(stats["hits"], stats["misses"], maxsize, len(entries),
                                 stats["nbytes"], stats["budget"], stats["evictions"])

        def cache_clear() -> None:
            with lock:
                entries.clear()
                stats.update(hits=0, misses=0, nbytes=0, evictions=0)

        def set_budget(nbytes: int) -> None:
            """Set the byte budget (evicting down to it at the next add)."""
            with lock:
                stats["budget"] = int(nbytes)

        cached.cache_info, cached.cache_clear = cache_info, cache_clear
        cached.set_budget = set_budget
        return cached

    return wrap
