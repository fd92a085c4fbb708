"""`rnnrt sweep --gpus` / `--shard K/N` (bench/shards.py, sweep.grid): the grid dealt out in
shares, a child process a GPU; on the CPU, the shares run as CPU sweeps."""
from __future__ import annotations

import io
import json
import subprocess

import pytest
from testkit import tiny_sweep as tiny

from rnnrt import cli
from rnnrt.bench import shards
from rnnrt.bench import sweep as sw


def test_shards_deal_the_grid_out_whole_disjoint_and_even():
    cfg = tiny(hidden=(6, 8, 10), batch=(2, 3, 4), cells=("lstm", "gru"))
    full = sw.grid(cfg)
    for n in (1, 2, 3, 5):
        shares = [sw.grid(tiny(hidden=(6, 8, 10), batch=(2, 3, 4), cells=("lstm", "gru"),
                               shard=(k, n))) for k in range(1, n + 1)]
        keys = [p.key() for s in shares for p in s]
        assert sorted(keys) == sorted(p.key() for p in full) and len(set(keys)) == len(keys)
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1, sizes
        # dealt like cards from the cheapest up: no share holds only the expensive tail
        flops = [sum(p.flops for p in s) for s in shares]
        assert max(flops) <= 2 * min(flops), flops
        for s in shares:
            assert [p.flops for p in s] == sorted(p.flops for p in s)   # cheapest first


def test_a_share_has_a_file_name_of_its_own_and_bad_shares_are_refused():
    assert sw.default_stem(tiny(shard=(2, 3))) == "sweep-lstm-shard2of3"
    assert sw.default_stem(tiny()) == "sweep-lstm"
    for bad in ((0, 2), (3, 2), (1,), (1.0, 2), (True, 2), "1/2"):
        with pytest.raises(ValueError, match="shard"):
            tiny(shard=bad)


def test_shard_argv_drops_gpus_and_adds_the_share():
    argv = ["sweep", "--preset", "wide", "--gpus", "0,1", "--resume"]
    assert shards.shard_argv(argv, 2, 2) == ["sweep", "--preset", "wide", "--resume",
                                             "--shard", "2/2"]
    assert shards.shard_argv(["sweep", "--gpus=3", "--cpu"], 1, 1) == \
        ["sweep", "--cpu", "--shard", "1/1"]


def test_visible_device_is_relative_to_the_parents_own_list():
    assert shards.visible_device(1, {}) == "1"
    assert shards.visible_device(1, {"CUDA_VISIBLE_DEVICES": ""}) == "1"
    assert shards.visible_device(1, {"CUDA_VISIBLE_DEVICES": "4, 6"}) == "6"
    with pytest.raises(ValueError, match="--gpus: GPU 2 is not among the 2"):
        shards.visible_device(2, {"CUDA_VISIBLE_DEVICES": "4,6"})


class _FakeChild:
    def __init__(self, lines, code):
        self.stdout, self.code = io.StringIO("".join(lines)), code

    def wait(self):
        return self.code


def test_run_shards_starts_one_child_a_gpu_and_prefixes_their_lines():
    started = []

    def popen(cmd, **kw):
        assert kw["env"]["PYTHONUNBUFFERED"] == "1"      # lines as they are written
        started.append((cmd, kw["env"]["CUDA_VISIBLE_DEVICES"], kw["stderr"]))
        k = len(started)
        return _FakeChild([f"line {k}a\n", f"line {k}b"], code=k - 1)

    out = io.StringIO()
    codes = shards.run_shards(["sweep", "--gpus", "2,5", "--quick"], [2, 5], popen=popen,
                              out=out, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6"})
    assert codes == [0, 1]
    assert [c[0][-4:] for c in started] == [["sweep", "--quick", "--shard", "1/2"],
                                            ["sweep", "--quick", "--shard", "2/2"]]
    assert [c[0][1:3] for c in started] == [["-m", "rnnrt"]] * 2
    assert [c[1] for c in started] == ["2", "5"]
    assert all(c[2] is subprocess.STDOUT for c in started)
    text = out.getvalue().splitlines()
    for gpu, k in ((2, 1), (5, 2)):
        assert f"[gpu {gpu}] line {k}a" in text and f"[gpu {gpu}] line {k}b" in text
        assert f"[gpu {gpu}] rnnrt sweep --quick --shard {k}/2" in text


def test_children_split_the_hosts_cores_for_blas_unless_told():
    """Two children on a 32-core host: 16 BLAS threads each (not 32 each: 2x oversubscribed);
    a host of fewer cores than children: 1 each; a BLAS thread count the caller set stands."""
    assert shards.blas_threads(2, env={}, cores=32) == {
        v: "16" for v in shards.BLAS_THREAD_VARIABLES}
    assert set(shards.blas_threads(3, env={}, cores=2).values()) == {"1"}
    assert shards.blas_threads(2, env={"OPENBLAS_NUM_THREADS": "4"}, cores=32) == {}
    seen = []

    def popen(cmd, **kw):
        seen.append({v: kw["env"].get(v) for v in shards.BLAS_THREAD_VARIABLES})
        return _FakeChild([], code=0)

    shards.run_shards(["sweep"], [0, 1], popen=popen, out=io.StringIO(), env={})
    expect = shards.blas_threads(2, env={})
    assert seen == [expect, expect] and all(int(x) >= 1 for x in expect.values())
    seen.clear()
    shards.run_shards(["sweep"], [0, 1], popen=popen, out=io.StringIO(),
                      env={"OMP_NUM_THREADS": "3"})
    assert seen[0]["OMP_NUM_THREADS"] == "3" and seen[0]["OPENBLAS_NUM_THREADS"] is None


def test_sweep_on_two_gpus_on_the_cpu_writes_a_file_a_share_and_resumes(tmp_path,
                                                                        monkeypatch, capsys):
    """The whole path through the CLI, its children real processes (CPU sweeps): the two
    shard files hold the grid between them; --resume with the same list runs nothing."""
    monkeypatch.setenv("RNNRT_OUT", str(tmp_path))
    argv = ["sweep", "--cpu", "--gpus", "0,1", "--hidden", "6,8", "--batch", "2,3",
            "--layers", "1", "--steps", "3", "--repeats", "1", "--warmup", "0",
            "--rungs", "auto"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    files = sorted((tmp_path / "results" / "sweep").glob("*.jsonl"))
    assert [f.name.split("-cpu-")[0] for f in files] == ["sweep-lstm-shard1of2",
                                                         "sweep-lstm-shard2of2"], files
    keys = []
    for f in files:
        rows = [json.loads(x) for x in f.read_text().splitlines()]
        keys += sorted({(r["hidden"], r["batch"]) for r in rows if r["type"] == "row"})
    assert sorted(keys) == [(6, 2), (6, 3), (8, 2), (8, 3)]
    assert "[gpu 0]" in out and "[gpu 1]" in out and "2 shard file(s)" in out
    assert cli.main(argv + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert out.count("0 points done, 0 raised, 2 were already there") == 2, out
    assert sorted((tmp_path / "results" / "sweep").glob("*.jsonl")) == files


def _status(argv) -> int:
    """cli.main's exit status; an argparse error (a flag's type) exits 2 by SystemExit."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("extra, words", [
    (["--gpus", "0,0"], "a GPU named twice"),
    (["--gpus", "0,1", "--shard", "1/2"], "--gpus and --shard"),
    (["--gpus", "0,1", "--out", "x.jsonl"], "--gpus and --out"),
    (["--gpus", "0,1", "--dry-run"], "--gpus and --dry-run"),
    (["--shard", "3/2"], "expected K/N with 1 <= K <= N"),
    (["--shard", "a/b"], "expected K/N"),
    (["--gpus", "-1"], "--gpus"),
])
def test_bad_gpus_and_shards_are_refused_before_any_work(extra, words, tmp_path, monkeypatch,
                                                         capsys):
    monkeypatch.setenv("RNNRT_OUT", str(tmp_path))
    assert _status(["sweep", "--cpu", "--hidden", "6", *extra]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "results").exists()
