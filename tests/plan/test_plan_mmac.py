"""The tensor-core cluster kernel's family ('mmac', rnnrt/kernels/mmac.py) in plans, without a
GPU: a bfloat16 / float16 key that names it runs its kernel (no fallback), and the NumPy
executor's plan (the kernel's twin: the emulation with its parts of the sum over k) equals
the rounding-aware reference to float64 agreement (the twin runs in the workspace's float64,
so the tensor core's summation order, which the GPU tests allow for, does not show here);
float32 and tf32 keys fall back to the schedule without the switch, saying why; the
selector's candidates and the fitting families name it for 16-bit shapes only, before the
FMA cluster kernel; a training key runs it with the FMA backward; its grid form likewise
(the fit held to it), and where no cluster holds R (LSTM H 1024) the fit takes it.
"""
from __future__ import annotations

import pytest
from test_plan_mma import PERSISTENT, check_declines_with_the_reason, check_family_plan
from test_plan_precision import case, check, key_of, run_plans

from rnnrt.kernels import choice, selector
from rnnrt.kernels import mmac as MC
from rnnrt.kernels.limits import H100_SXM
from testkit import mmac_grid_form_held

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@pytest.mark.parametrize("dtype", MC.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_mmac_family_runs_its_kernel_and_equals_the_reference(cell, dtype):
    check_family_plan(cell, dtype, "mmac", MC.kernel_name(cell), "tensor-core cluster kernel", 7)


@pytest.mark.parametrize("dtype", MC.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_the_grid_form_runs_its_kernel_and_equals_the_reference(monkeypatch, cell, dtype):
    """The fit held to the grid form (persistent_mmag.cu): its kernel runs, its twin (the
    grid kernel's emulation over one block a U units, every batch) equals the reference, and
    the plan gives the launch its barrier counters."""
    with mmac_grid_form_held(monkeypatch):
        check_family_plan(cell, dtype, "mmac", MC.kernel_name(cell, MC.GRID_FORM),
                          "the grid form", 8)


@pytest.mark.parametrize("dtype", MC.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_the_wide_form_runs_its_kernel_and_equals_the_reference(cell, dtype):
    """A count that gives a cluster more than one n8 tile (PlanKey.clusters 2 at B 20: 10
    batches a cluster) runs the wide form (persistent_mmacw.cu), and its twin equals the
    reference; the plan's fit string names the count."""
    check_family_plan(cell, dtype, "mmac", MC.kernel_name(cell, wide=True), "the wide form",
                      9, batch=20, clusters=2)
    check_family_plan(cell, dtype, "mmac", MC.kernel_name(cell), "as the key names", 9,
                      batch=20, clusters=3)   # 7 batches a cluster: one tile


@pytest.mark.parametrize("dtype", ("float32", "tf32"))
def test_fp32_and_tf32_keys_decline_with_the_reason(dtype):
    check_declines_with_the_reason("mmac", dtype)


def test_a_planted_twin_fault_is_caught(monkeypatch):
    """The check can fail: a twin whose first part drops its last column differs."""
    real = MC.MmacFit.part_columns

    def short(self, part):
        cols = real(self, part)
        return cols[:-1] if part == 0 and len(cols) else cols
    monkeypatch.setattr(MC.MmacFit, "part_columns", short)
    c = case("lstm", "bfloat16", seed=7)
    key = key_of("lstm", PERSISTENT, "bfloat16", False, family="mmac")
    with pytest.raises(AssertionError):
        check(run_plans(key, c), c, "planted")


def _shape(dtype, hidden=256, batch=8, cell="lstm"):
    return selector.Shape(cell, 1, hidden, hidden, batch, 100, False, dtype=dtype)


def test_candidates_name_mmac_for_16_bit_shapes_it_fits():
    for dtype in MC.MMA_DTYPES:
        fams = choice.fitting_families(_shape(dtype), H100_SXM)
        assert "mmac" in fams and "fits" in fams["mmac"]
        names = [s.name for s in choice.candidates(_shape(dtype), H100_SXM)]
        assert "mmac" in names and names.index("mmac") < names.index("cluster"), names
    for dtype in ("float32", "tf32"):
        assert "mmac" not in choice.fitting_families(_shape(dtype), H100_SXM)
    # LSTM H 512 at clusters of 16; H 1024: a block's 16-bit R slice (528 KB at 16) fits no
    # cluster, the grid form takes it (one block an SM); H 2048 not even that (257 KB)
    fams = choice.fitting_families(_shape("float16", hidden=512), H100_SXM)
    assert "mmac" in fams and "of 16 blocks" in fams["mmac"]
    fams = choice.fitting_families(_shape("float16", hidden=1024), H100_SXM)
    assert "mmac" in fams and "the grid form" in fams["mmac"]
    names = [s.name for s in choice.candidates(_shape("float16", hidden=1024), H100_SXM)]
    assert "mmac" in names, names
    assert "mmac" not in choice.fitting_families(_shape("float16", hidden=2048), H100_SXM)
    assert not MC.mmac_fit("lstm", 2048, 8, H100_SXM.props(), "float16").ok


def test_the_heuristic_takes_mmac_for_one_16_bit_layer_up_to_128_batches():
    """B 128 too since the wide form (8 clusters of 16 batches; H200, float16, LSTM H 128 /
    256 B 128: 0.28 / 0.37 ms against the register-resident kernel's 0.40 and the cuBLAS
    rungs' 0.66); at B 256 not (a tie with the rungs at H 256)."""
    for dtype in MC.MMA_DTYPES:
        for hidden in (128, 256):
            for batch in (8, 64, 128):
                assert choice.forward_heuristic(_shape(dtype, hidden, batch),
                                                H100_SXM).family == "mmac"
        assert choice.forward_heuristic(_shape(dtype, batch=256), H100_SXM).family != "mmac"
        four = selector.Shape("lstm", 4, 256, 256, 8, 100, False, dtype=dtype)
        assert choice.forward_heuristic(four, H100_SXM).family != "mmac"
    assert choice.forward_heuristic(_shape("float32"), H100_SXM).family != "mmac"


def test_the_heuristic_takes_the_grid_form_wherever_it_fits():
    """Untimed, the grid form (LSTM / GRU H 1024) at every batch it fits (B <= 32: since its
    blocks share the staging in pairs, 1.2x the cuBLAS rungs at B 32, 1.7x at B 8); past
    that (no fit) the rungs."""
    for cell in ("lstm", "gru"):
        for batch, mmac in ((8, True), (5, True), (32, True), (16, True)):
            shape = _shape("float16", 1024, batch, cell)
            fit = MC.mmac_fit(cell, 1024, batch, H100_SXM.props(), "float16")
            assert fit.ok and fit.cluster == MC.GRID_FORM, fit.reason
            assert (choice.forward_heuristic(shape, H100_SXM).family == "mmac") == mmac, \
                (cell, batch)
        assert not MC.mmac_fit(cell, 1024, 40, H100_SXM.props(), "float16").ok
        assert choice.forward_heuristic(_shape("float16", 1024, 40, cell),
                                        H100_SXM).family != "mmac"


def test_candidates_time_other_counts_up_to_the_cap():
    """At B 256 the rule's 8 clusters of 32 batches (four n8 tiles; the wide form); the
    selector also times counts with fewer batches a cluster up to the co-resident cap (a
    fake driver answer here), the whole cap for any number of layers (the launches are one a
    layer, never side by side); none where the rule's clusters hold one n8 tile (B 64: more
    clusters would multiply the same tile), at clusters of 16, at fp32, or past the cap."""
    from rnnrt.kernels.occupancy import ClusterCap

    asked = []

    def cap(n):   # a fake driver: records the kernel and precision it was asked about
        return lambda fit, dtype="float32": asked.append((fit.kernel, dtype)) or ClusterCap(
            n, "driver", "fake")

    def counts(shape, n):
        return [s.clusters for s in choice.candidates(shape, H100_SXM, cap(n))
                if s.family == "mmac" and s.clusters]
    one = _shape("float16", hidden=128, batch=256)
    assert counts(one, 14) == [10, 12, 14]
    assert ("lstm_persistent_mmacw_fwd", "float16") in asked   # the key's instantiation
    assert counts(one, 8) == []
    assert counts(_shape("float16", hidden=128, batch=64), 14) == []   # 8 one-tile clusters
    four = selector.Shape("lstm", 4, 128, 128, 256, 100, False, dtype="float16")
    assert counts(four, 14) == [10, 12, 14]
    assert counts(_shape("float32", hidden=128, batch=256), 14) == []
    assert counts(_shape("float16", hidden=512, batch=128), 32) == []   # clusters of 16
    names = [s.name for s in choice.candidates(one, H100_SXM, cap(14))]
    assert names.index("mmac") < names.index("mmac/10"), names
