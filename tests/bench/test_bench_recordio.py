"""The one loader of records (rnnrt/bench/recordio.py) and the output checks (outputs.py).

Property-based (hypothesis): a results file of random valid lines with random damage applied
to some of them — every damaged line is skipped and named `file:line`, every valid line is
kept with its line number, a torn last line is noted and never a problem, and the loader
never raises; arbitrary bytes and arbitrary JSON values never make it (or the ladder-record
check) raise. Plus: atomic writes, and output paths checked before any work."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rnnrt.bench import recordio
from rnnrt.bench.outputs import OutputError, StagedDir, check_dir, check_file
from rnnrt.cells import CELLS

FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

rows = st.fixed_dictionaries({
    "type": st.just("row"), "cell": st.sampled_from(sorted(CELLS)),
    "layers": st.integers(1, 8), "hidden": st.integers(1, 4096),
    "input_size": st.integers(1, 4096), "batch": st.integers(1, 512),
    "steps": st.integers(1, 10**6), "input_batch": st.one_of(st.integers(1, 100),
                                                           st.just("all")),
    "pass": st.sampled_from(["fwd", "fwd+bwd"]), "rung": st.text(min_size=1, max_size=12),
    "executor": st.sampled_from(["graph", "eager", "numpy"]),
    "ms_median": st.floats(1e-3, 1e4), "tflops": st.floats(0, 100)})

DAMAGE = {
    "number": lambda r: "42",
    "list": lambda r: json.dumps([r]),
    "string": lambda r: json.dumps("row"),
    "null": lambda r: "null",
    "not-json": lambda r: json.dumps(r)[:-3] + "}}}",
    "drop-field": lambda r: json.dumps({k: v for k, v in r.items() if k != "hidden"}),
    "negative": lambda r: json.dumps({**r, "batch": -r["batch"]}),
    "bool": lambda r: json.dumps({**r, "layers": True}),
    "float-count": lambda r: json.dumps({**r, "steps": r["steps"] + 0.5}),
    "cell": lambda r: json.dumps({**r, "cell": "xlstm"}),
    "type": lambda r: json.dumps({**r, "type": 3}),
    "time": lambda r: json.dumps({**r, "ms_median": -1}),
    "k": lambda r: json.dumps({**r, "input_batch": "some"}),
}


@FAST
@given(st.lists(st.tuples(rows, st.one_of(st.none(), st.sampled_from(sorted(DAMAGE)))),
                min_size=1, max_size=12),
       st.booleans())
def test_random_damage_is_skipped_and_named(tmp_path, lines, torn):
    path = tmp_path / "r.jsonl"
    text, bad, good = [], [], []
    for n, (row, damage) in enumerate(lines, 1):
        if damage is None:
            text.append(json.dumps(row).encode())
            good.append((n, row))
        else:
            text.append(DAMAGE[damage](row).encode())
            bad.append(n)
    data = b"\n".join(text) + b"\n"
    if torn:
        data += json.dumps(lines[0][0]).encode()[:-2]      # cut short by a kill
    path.write_bytes(data)
    loaded = recordio.read_jsonl(path)
    assert [(n, o) for n, o in loaded.lines] == good
    assert [int(p.split(":")[1]) for p in loaded.problems] == bad
    assert all(p.startswith(f"{path}:") for p in loaded.problems)
    assert (loaded.torn is not None) == torn
    assert path.read_bytes() == data                        # reading changes nothing


@FAST
@given(st.binary(max_size=400))
def test_any_bytes_never_raise(tmp_path, data):
    path = tmp_path / "b.jsonl"
    path.write_bytes(data)
    loaded = recordio.read_jsonl(path)
    assert all(p.startswith(f"{path}:") for p in loaded.problems)
    obj, why = recordio.read_json(path)
    assert (obj is None) == (why is not None) or obj is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=20)


@FAST
@given(json_values, json_values)
def test_any_json_never_makes_the_checks_raise(value, config):
    assert recordio.check_line(value) is None or isinstance(recordio.check_line(value), str)
    rec = {"schema": "rnnrt.ladder/1", "config": config, "device": {"device": "x"},
           "rows": value}
    why = recordio.check_ladder_record(rec)
    assert why is None or isinstance(why, str)
    assert isinstance(recordio.check_ladder_record(value), str)


def test_cell_names_are_the_cells():
    assert recordio.CELL_NAMES == tuple(sorted(CELLS))


def test_a_file_that_cannot_be_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        recordio.read_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(recordio.RecordError, match="cannot be read"):
        recordio.read_jsonl(tmp_path)


# --------------------------------------------------------------------------- writing

def test_atomic_write_keeps_the_old_file_when_it_fails(tmp_path, monkeypatch):
    p = tmp_path / "r.json"
    p.write_text("old")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        recordio.write_text_atomic(p, "new")
    assert p.read_text() == "old" and sorted(x.name for x in tmp_path.iterdir()) == ["r.json"]


def test_write_without_overwrite_refuses_an_existing_file(tmp_path):
    p = tmp_path / "sub" / "r.json"
    recordio.write_text_atomic(p, "one", overwrite=False)      # the folder is created
    with pytest.raises(FileExistsError, match="--overwrite"):
        recordio.write_text_atomic(p, "two", overwrite=False)
    assert p.read_text() == "one" and len(list(p.parent.iterdir())) == 1


def test_output_checks(tmp_path):
    (tmp_path / "f").write_text("x")
    assert check_file(tmp_path / "new" / "deep" / "r.json", "--out").parent.is_dir()
    for bad, words in (("", "empty"), (tmp_path, "folder"), (tmp_path / "f", "already exists"),
                       (tmp_path / "f" / "r.json", "is a file")):
        with pytest.raises(OutputError) as e:
            check_file(bad, "--out")
        assert "--out" in str(e.value) and words in str(e.value)
    assert check_file(tmp_path / "f", "--out", overwrite=True) == tmp_path / "f"
    assert check_dir(tmp_path / "figs", "--out-dir").is_dir()
    with pytest.raises(OutputError, match="--out-dir: .* is a file"):
        check_dir(tmp_path / "f", "--out-dir")


def test_staged_files_move_in_together_or_not_at_all(tmp_path):
    (tmp_path / "b.png").write_text("old")
    staged = StagedDir(tmp_path, overwrite=False)
    with pytest.raises(OutputError, match="b.png"):
        with staged as tmp:
            written = [tmp / "a.png", tmp / "b.png"]
            for w in written:
                w.write_text("new")
            staged.commit(written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.png"]
    assert (tmp_path / "b.png").read_text() == "old"
    staged = StagedDir(tmp_path, overwrite=True)
    with staged as tmp:
        (tmp / "b.png").write_text("new")
        staged.commit([tmp / "b.png"])
    assert (tmp_path / "b.png").read_text() == "new" and len(list(tmp_path.iterdir())) == 1
