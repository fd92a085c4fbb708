"""The cluster kernel's cluster count as a measured choice (rnnrt/kernels/choice.py,
occupancy.py, PlanKey.clusters), without a GPU: the counts the selector times (present,
capped by the device's co-resident cap, none above it, none where the cluster kernel does
not fit, the per-layer share for chunked plans); a key's count carried exactly into the plan,
its launch and its fit string; the count through the disk cache (and an entry written before
it); the cap from the driver, derived from the properties, and the rule's when the query is
unavailable, said in the selection's note."""
from __future__ import annotations

import ctypes
import json

import pytest

from rnnrt.kernels import choice as C
from rnnrt.kernels import selector as SEL
from rnnrt.kernels import counts as CN
from rnnrt.kernels import occupancy as O
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.persistent import PK_CLUSTER, cluster_count, persistent_fit
from rnnrt.kernels.tuning import ScheduleCache, device_key
from rnnrt.plan import PlanKey, forward_plan
from rnnrt.plan.switches import Switches

GRU256 = SEL.Shape("gru", 1, 128, 128, 256, 100)   # measured: 14 clusters beat the rule's 8
PROPS = H100_SXM.props()


def names(scheds):
    return [s.name for s in scheds]


def cap(n, source="driver"):
    return lambda fit, dtype="float32": O.ClusterCap(n, source, f"fake {source}")


def counts(shape, cap_fn=None, family="cluster"):
    return [s.clusters for s in C.candidates(shape, H100_SXM, cap_fn)
            if s.clusters and s.family == family]


# --- which counts are timed ----------------------------------------------------------------

def test_extra_counts_give_fewer_batches_a_cluster_up_to_the_cap():
    # B 256, rule 8 (32 a cluster), cap 15: spread over 9..15, the largest kept
    assert CN.extra_cluster_counts(256, 8, 15) == (10, 13, 15)
    assert CN.extra_cluster_counts(256, 8, 10) == (9, 10)        # few: all of them
    assert CN.extra_cluster_counts(256, 8, 8) == ()               # the cap is the rule's
    assert CN.extra_cluster_counts(256, 8, 4) == ()               # a cap below the rule
    assert CN.extra_cluster_counts(8, 2, 16) == (3, 4, 8)         # 3, 2, 1 batches a cluster
    for b in (1, 7, 32, 100, 128, 256, 1000):
        for rule in (1, 2, 8):
            for top in (1, 8, 15, 40):
                got = CN.extra_cluster_counts(b, rule, top)
                assert len(got) <= CN.MAX_EXTRA_COUNTS and all(rule < n <= top for n in got)
                # each the fewest clusters for its batches a cluster: no empty cluster
                for n in got:
                    bg = -(-b // n)
                    assert -(-b // bg) == n and (n - 1) * bg < b


def test_candidates_carry_counts_under_the_cap_and_only_where_the_cluster_kernel_fits():
    got = C.candidates(GRU256, H100_SXM, cap(14))
    rule = cluster_count(256, H100_SXM.sms)
    assert names(got)[:4] == ["solo", "cluster", "regs", "grid"] and rule == 8
    assert counts(GRU256, cap(14)) == [10, 12, 14]
    for s in got:
        if s.clusters:
            assert s.name == f"{s.family}/{s.clusters}" and s.family in ("cluster", "regs")
    assert all(n <= 14 for n in counts(GRU256, cap(14)))
    assert counts(GRU256, cap(9)) == [9]
    assert counts(GRU256, cap(8)) == []                        # nothing above the rule fits
    assert counts(GRU256, cap(3)) == []
    # default (CPU): derived from the properties, one block an SM: 132 // 8
    derived = max(counts(GRU256))
    assert derived == H100_SXM.sms // PK_CLUSTER == 16
    # no cluster kernel: R of H 2048 fits no cluster; a bfloat16 key has the same counts
    # (the cluster kernel's typed instantiation; its fit is the fp32 layout)
    assert counts(SEL.Shape("lstm", 1, 2048, 2048, 64, 100), cap(16)) == []
    assert counts(SEL.Shape("gru", 1, 128, 128, 256, 100, dtype="bfloat16"), cap(16)) \
        == counts(GRU256, cap(16))
    assert counts(SEL.Shape("gru", 1, 128, 128, 256, 100, varlen=True), cap(16)) == []


def test_chunked_plans_take_counts_within_each_layers_share():
    four = SEL.Shape("lstm", 4, 128, 128, 64, 100)   # 4 layers' launches overlap (chunked)
    rule = cluster_count(64, H100_SXM.sms, 4)
    assert rule == 4
    assert counts(four, cap(16)) == []              # the share, 16 // 4, is the rule's
    got = counts(four, cap(32))                     # share 8
    assert got and all(rule < n <= 8 for n in got)
    one = SEL.Shape("lstm", 4, 128, 128, 64, 8)       # 8 steps: one chunk, not chunked
    assert max(counts(one, cap(32))) > 8


def test_every_count_candidate_is_a_plan_that_runs_exactly_that_count():
    for s in C.candidates(GRU256, H100_SXM, cap(14)):
        if not s.clusters:
            continue
        key = C.with_family(PlanKey("gru", 100, 256, 128, 128, 1, True, s.switches,
                                    device=H100_SXM), s)
        assert key.clusters == s.clusters
        plan = forward_plan(key)
        assert plan.fallback is None
        launches = [op.launch for op in plan.ops if getattr(op, "launch", None)]
        assert launches and all(g == (PK_CLUSTER * s.clusters, 1, 1) for g, _, _ in launches)
        assert f"{s.clusters} clusters of {PK_CLUSTER} blocks" in plan.fit
        assert "as the key names (PlanKey.clusters)" in plan.fit


# --- the key ---------------------------------------------------------------------------------

SW = Switches(grouped=True, streams=True, fused=True, wavefront=True, input_batch=10,
              persistent=True)


def key(**kw):
    args = dict(device=H100_SXM, family="cluster")
    args.update(kw)
    return PlanKey(args.pop("cell", "lstm"), args.pop("steps", 20), args.pop("batch", 128),
                   128, 128, args.pop("layers", 1), True, SW, **args)


def test_the_key_names_the_count_and_refuses_a_bad_one():
    assert key(clusters=11) != key(clusters=12) != key()
    assert hash(key(clusters=11)) == hash(key(clusters=11))
    for bad in (0, -2, 2.0, True, "8"):
        with pytest.raises(ValueError, match="PlanKey.clusters: expected an int >= 1"):
            key(clusters=bad)
    for fam in (None, "grid", "stack"):
        with pytest.raises(ValueError, match="PlanKey.clusters: a cluster family's count"):
            key(family=fam, clusters=8)


def test_an_explicit_count_runs_exactly_where_the_rule_would_differ():
    rule = forward_plan(key()).fit
    assert "8 clusters of 8 blocks" in rule and "PlanKey.clusters" not in rule
    for n in (5, 13, 16, 32):   # past the device's cap still runs (in waves): correct
        plan = forward_plan(key(clusters=n))
        assert plan.fallback is None and f"{n} clusters of 8" in plan.fit
    # one cluster of 128 batches: more cells a thread than the kernel updates, declined
    plan = forward_plan(key(clusters=1))
    assert plan.fallback and "cells > 2 a thread" in plan.fallback
    # chunked (4 layers, 10-step chunks): the rule's per-layer share, or exactly the key's
    share = forward_plan(key(layers=4, batch=64)).fit
    assert "4 clusters of 8 blocks" in share and "layers overlap" in share
    mine = forward_plan(key(layers=4, batch=64, clusters=6))
    assert "6 clusters of 8 blocks" in mine.fit and "layers overlap" in mine.fit
    assert all(op.launch[0] == (48, 1, 1) for op in mine.ops if getattr(op, "launch", None))
    # a count that leaves a cluster empty: declined, saying why
    plan = forward_plan(key(batch=8, clusters=6))
    assert plan.fallback and "leave the last empty" in plan.fallback


# --- the selector and the cache --------------------------------------------------------------

class Timer:
    def __init__(self, ms):
        self.ms, self.calls = ms, []

    def __call__(self, sched, shape, repeats):
        self.calls.append(sched.name)
        return [self.ms.get(sched.name, 9.0)] * repeats


DEV = device_key({"device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                  "cuda_driver": 13000, "cuda_runtime": 13020, "cupy": "14.2.0",
                  "rnnrt": "0.1.0"})


def test_the_fastest_count_is_chosen_and_survives_the_cache(tmp_path):
    path = tmp_path / "schedules.json"
    timer = Timer({"cluster": 1.0, "cluster/12": 0.9, "grid": 1.5})
    sel = SEL.Selector(timer, H100_SXM, ScheduleCache(DEV, path), autotune=True,
                     cluster_cap=cap(14)).select(GRU256)
    assert sel.schedule.name == "cluster/12" and sel.schedule.clusters == 12
    assert sel.as_dict()["clusters"] == 12 and "co-resident cap 14" in sel.note
    # each family's cap, named by its kernel (the regs kernel's may differ from the cluster's)
    assert "gru_persistent_cluster_fwd co-resident cap 14" in sel.note, sel.note
    assert "gru_persistent_regs_fwd co-resident cap 14" in sel.note, sel.note
    assert {"cluster/10", "cluster/12", "cluster/14"} <= set(timer.calls)
    again = Timer({})
    back = SEL.Selector(again, H100_SXM, ScheduleCache(DEV, path), autotune=True).select(GRU256)
    assert again.calls == [] and back.source == "cache" and back.schedule == sel.schedule
    # an entry written before the count was a choice (no 'clusters'): the rule's count
    data = json.loads(path.read_text())
    entry = data["devices"][DEV][GRU256.key()]
    entry["schedule"] = {k: v for k, v in C.persistent_schedule("cluster").as_dict().items()
                         if k != "clusters"}
    path.write_text(json.dumps(data))
    old = SEL.Selector(Timer({}), H100_SXM, ScheduleCache(DEV, path), autotune=True)
    got = old.select(GRU256).schedule
    assert got.name == "cluster" and got.clusters is None
    # a damaged count is refused (and tuned again)
    for bad in ({"clusters": 0}, {"clusters": 8, "family": "grid", "name": "grid"}):
        d = {**CN.cluster_schedule(8).as_dict(), **bad}
        with pytest.raises(ValueError, match="is not a cluster count"):
            C.Schedule.from_dict(d)


def test_the_rule_stands_in_when_the_occupancy_query_is_unavailable():
    fit = persistent_fit("gru", 128, 256, PROPS, kind="cluster")

    class Loaded:   # a cupy.RawKernel's shape: .kernel.ptr is the CUfunction
        class kernel:
            ptr = 0x1234

    def failing(out, func, cfg):
        return 1   # CUDA_ERROR_INVALID_VALUE

    c = O.cluster_cap(fit, PROPS, Loaded(), query=failing)
    assert c.source == "rule" and c.clusters == H100_SXM.sms // (2 * PK_CLUSTER)
    assert "occupancy query unavailable" in c.describe() and "CUresult 1" in c.note
    assert O.cluster_cap(fit, PROPS, object(), query=failing).source == "rule"   # no ptr
    sel = SEL.Selector(Timer({"cluster": 1.0}), H100_SXM, autotune=True,
                     cluster_cap=lambda f, dtype: O.cluster_cap(f, PROPS, Loaded(), query=failing))
    s = sel.select(GRU256)
    assert "occupancy query unavailable" in s.note
    assert not any(r["name"].startswith("cluster/") for r in s.candidates)   # the rule: 8


def test_no_libcuda_is_unavailable_not_a_crash(monkeypatch):
    def no_lib(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    with pytest.raises(O.OccupancyUnavailable, match="no cuOccupancyMaxActiveClusters"):
        O.libcuda_query()
    fit = persistent_fit("gru", 128, 256, PROPS, kind="cluster")

    class Loaded:
        class kernel:
            ptr = 0x1234

    assert O.cluster_cap(fit, PROPS, Loaded()).source == "rule"


def test_the_driver_query_gets_the_launch_config_and_its_answer_is_the_cap():
    fit = persistent_fit("lstm", 128, 256, PROPS, kind="cluster")
    seen = {}

    def driver(out, func, cfg):
        c = cfg._obj
        seen.update(func=func.value, block=c.blockDimX, smem=c.sharedMemBytes,
                    grid=c.gridDimX, dims=(c.attrs[0].id, c.attrs[0].value.clusterDim.x,
                                           c.attrs[0].value.clusterDim.y), n=c.numAttrs)
        out._obj.value = 14
        return 0

    class Loaded:
        class kernel:
            ptr = 0xABC0

    c = O.cluster_cap(fit, PROPS, Loaded(), query=driver)
    assert (c.clusters, c.source) == (14, "driver")
    assert seen == {"func": 0xABC0, "block": fit.threads, "smem": fit.smem_bytes,
                    "grid": PK_CLUSTER, "dims": (O.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                                                 PK_CLUSTER, 1), "n": 1}

    def zero(out, func, cfg):
        out._obj.value = 0
        return 0

    assert O.cluster_cap(fit, PROPS, Loaded(), query=zero).source == "rule"
    # a kernel of clusters of 16 (the tensor-core cluster kernel's): asked as 16 blocks
    from rnnrt.kernels.mmac import mmac_fit
    f16 = mmac_fit("lstm", 512, 64, PROPS, "float16")
    assert f16.cluster == 16
    O.cluster_cap(f16, PROPS, Loaded(), query=driver)
    assert (seen["grid"], seen["dims"][1]) == (16, 16)


def test_the_derived_cap_counts_blocks_an_sm_holds():
    fit = persistent_fit("gru", 128, 256, PROPS, kind="cluster")
    assert O.blocks_per_sm(PROPS, fit.threads, fit.smem_bytes, 255) == 1   # registers
    assert O.blocks_per_sm(PROPS, 128, 1024, 32) == 16                       # threads
    assert O.blocks_per_sm(PROPS, 32, 100_000, 32) == 2                      # shared memory
    d = O.derived_cap(fit, PROPS)
    assert (d.clusters, d.source) == (16, "derived") and "upper bound" in d.note
    from rnnrt.kernels.mmac import mmac_fit   # clusters of 16: half as many
    assert O.derived_cap(mmac_fit("lstm", 512, 64, PROPS, "float16"), PROPS).clusters == 8
    with pytest.raises(ValueError, match="not a cluster kernel"):
        O.cluster_cap(persistent_fit("gru", 128, 256, PROPS, kind="grid"), PROPS)


def test_the_register_resident_kernel_gets_its_own_counts():
    """The regs family times counts too (its blocks are small: its cap may pass the cluster
    kernel's); an explicit count runs exactly that many clusters; typed keys get the same
    counts (its typed instantiations: the fit does not depend on the dtype) and the cluster
    kernel's stay."""
    got = counts(GRU256, cap(30), "regs")
    assert got and all(8 < n <= 30 for n in got) and len(got) <= CN.MAX_EXTRA_COUNTS, got
    assert counts(GRU256, cap(8), "regs") == []
    bf16 = SEL.Shape("gru", 1, 128, 128, 256, 100, dtype="bfloat16")
    assert counts(bf16, cap(30), "regs") == got and counts(bf16, cap(14)) == [10, 12, 14]
    names_ = names(C.candidates(GRU256, H100_SXM, cap(30)))
    assert [n for n in names_ if n.startswith("regs/")] == [f"regs/{n}" for n in got]
    key = PlanKey("gru", 100, 256, 128, 128, 1, True, C.persistent_schedule("regs").switches,
                  family="regs", clusters=got[-1], device=H100_SXM)
    plan = forward_plan(key)
    assert plan.fallback is None and f"{got[-1]} clusters as the key names" in plan.fit, plan.fit
    with pytest.raises(ValueError, match="PlanKey.clusters"):
        PlanKey("gru", 100, 256, 128, 128, 1, True, C.persistent_schedule("grid").switches,
                family="grid", clusters=4, device=H100_SXM)
