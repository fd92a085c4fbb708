"""experiments/scripts/staging_bench.py without a GPU: which (staging, barrier) pairs it
times, that every one of its kernels compiles for sm_90a without spills (it inlines the
persistent kernels' primitives: a change to them shows here, not first on the device), and
that bad arguments are refused before any GPU work."""
import pytest

from testkit import example_module
from testkit_kernels import nvcc_usage

SB = example_module("staging_bench")


def test_pairs_only_where_they_can_run():
    todo = SB.combos(list(SB.VARIANTS), list(SB.BARRIERS))
    for v, b in todo:
        kind, cluster = SB.VARIANTS[v]
        if b in SB.PAIR_BARRIERS:
            assert cluster == 2, (v, b)        # a pair barrier needs clusters of 2
        assert (b == "none") == (kind == 4), (v, b)   # LL stagings are their own barrier
    assert {v for v, _ in todo} == set(SB.VARIANTS)
    assert {b for _, b in todo} == set(SB.BARRIERS)
    assert len(set(todo)) == len(todo)


def test_every_kernel_compiles_without_spills(tmp_path):
    todo = SB.combos(list(SB.VARIANTS), list(SB.BARRIERS))
    usage = nvcc_usage(SB.source() + "\n" + "\n".join(SB.declarations(todo)) + "\n", tmp_path)
    assert len(usage) == len(todo), [u[0] for u in usage]
    spills = [u for u in usage if u[2] != "0" or u[3] != "0"]
    assert not spills, spills


@pytest.mark.parametrize("args, what", [
    (["--variants", "mc2,bogus"], "--variants"),
    (["--barriers", "counter,fence"], "--barriers"),
    (["--blocks", "129"], "--blocks"),
    (["--hidden", "1000"], "--hidden"),
])
def test_bad_arguments_refused_before_any_gpu_work(tmp_path, capsys, args, what):
    with pytest.raises(SystemExit) as e:
        SB.main(["--out", str(tmp_path)] + args)
    assert e.value.code == 2
    assert what in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
