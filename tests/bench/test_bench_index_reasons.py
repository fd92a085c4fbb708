"""The results index names a damaged file's reason without the file (its own row shows it):
recordio gives the reasons as data (Loaded.damaged, read_json(named=False)), so nothing is
cut out of a message — 'f.json:3: not JSON' once became '3: not JSON'."""
from __future__ import annotations

import json

from rnnrt.bench import recordio
from rnnrt.bench.index import read_record


def test_a_broken_json_record_names_its_line(tmp_path):
    p = tmp_path / "ladder-x.json"
    p.write_text('{\n  "created": "2026",\n  "config": {oops}\n}\n')
    rec, why = read_record(p)
    assert rec is None and why.startswith("line 3: not JSON ("), why
    assert recordio.read_json(p)[1].startswith(f"{p}:3: not JSON (")   # named: as before
    p.write_bytes(b'{"a": "\xff"}')
    assert read_record(p)[1].startswith("not UTF-8 text (byte 0xff"), read_record(p)


def test_a_sweep_files_damaged_lines_are_data(tmp_path):
    p = tmp_path / "sweep-x.jsonl"
    session = {"type": "session", "created": "2026-11-21T12:00:00+00:00"}
    p.write_text(json.dumps(session) + "\nnot json\n" + json.dumps({"type": "nope"}) + "\n")
    loaded = recordio.read_jsonl(p)
    assert [n for n, _ in loaded.damaged] == [2, 3]
    assert loaded.problems == [f"{p}:{n}: {why}" for n, why in loaded.damaged]
    rec, why = read_record(p)
    assert why is None and rec["_problems"] == [f"line {n}: {w}" for n, w in loaded.damaged]
