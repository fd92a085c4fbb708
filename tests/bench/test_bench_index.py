"""experiments/results: the layout (kind folders only), the naming scheme and INDEX.md, which
rnnrt.bench.index generates (regenerate it with `python -m rnnrt.bench.index`)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from testkit import RECORD_KINDS as KINDS
from testkit import RECORD_SLUG as SLUG
from testkit import RECORD_STAMP as STAMP
from testkit import record_name_match

from rnnrt.bench.index import main, render_index

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"

# Session and stage tags of the old hand-made names; the stamp distinguishes runs now.
STAGE_TAG = re.compile(r"-(?:s\d+|r\d+|run\d+|final|first|review\d*)(?=[-.])")


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.split(",")[0].lower()).strip("-")


def _device(obj):
    """The first device name in a record (its own, else a nested one), or None."""
    if isinstance(obj, dict):
        dev = obj.get("device")
        if isinstance(dev, dict) and isinstance(dev.get("device"), str):
            return dev["device"]
        obj = list(obj.values())
    if isinstance(obj, list):
        return next((d for d in map(_device, obj) if d), None)
    return None


def _files():
    return sorted(p for p in RESULTS.rglob("*") if p.is_file() and p.name != "INDEX.md")


def test_index_is_generated_and_up_to_date():
    assert (RESULTS / "INDEX.md").read_text(encoding="utf-8") == render_index(ROOT), (
        "experiments/results/INDEX.md is out of date: run `python -m rnnrt.bench.index`")


def test_results_hold_only_kind_folders():
    top = sorted(p.name for p in RESULTS.iterdir())
    assert [n for n in top if (RESULTS / n).is_file()] == ["INDEX.md"]
    assert set(top) - {"INDEX.md"} <= set(KINDS)
    for p in _files():  # one level: experiments/results/<kind>/<file>
        assert p.parent.parent == RESULTS, p


def test_every_name_follows_the_scheme():
    files = _files()
    assert len(files) >= 100  # the records exist (a glob that finds nothing must not pass)
    for p in files:
        assert record_name_match(p.parent.name, p.name), p.name
        assert not STAGE_TAG.search(p.name), p.name
        slug, stamp = re.search(rf"-({SLUG})-({STAMP})\.[a-z]+$", p.name).groups()
        if p.suffix not in (".json", ".jsonl"):
            continue
        # A record's own fields win: its device gives the slug, its 'created' the stamp.
        text = p.read_text(encoding="utf-8")
        rec = json.loads(text.splitlines()[0] if p.suffix == ".jsonl" else text)
        device = _device(rec)
        if device:
            assert slug == _slug(device), p.name
        if rec.get("created"):
            assert stamp == re.sub(r"[-:]", "", rec["created"][:19]), p.name


SHAPE_H100 = "ladder-lstm-L4-H512-B64-T100-fwd-nvidia-h100-80gb-hbm3"
BROKEN = "ladder-lstm-L4-H512-B64-T1000-fwd-nvidia-h100-80gb-hbm3-20261121T110000.json"


def _tree(tmp_path: Path) -> Path:
    """A repository with one good ladder record, damaged records and a README citing one."""
    res = tmp_path / "experiments" / "results"
    for kind in ("ladder", "sweep", "kernels"):
        (res / kind).mkdir(parents=True)
    good = {"created": "2026-11-21T10:00:00+00:00", "pass": "fwd", "command": "rnnrt ladder",
            "device": {"device": "NVIDIA H100 80GB HBM3"},
            "config": {"cell": "lstm", "layers": 4, "hidden": 512, "batch": 64, "steps": 100}}
    (res / "ladder" / f"{SHAPE_H100}-20261121T100000.json").write_text(json.dumps(good))
    older = {**good, "created": "2026-11-21T09:00:00+00:00"}
    (res / "ladder" / f"{SHAPE_H100}-20261121T090000.json").write_text(json.dumps(older))
    (res / "ladder" / BROKEN).write_text('{"created": "2026-11')
    # No stamp in the name: the date comes from 'created', in UTC.
    cet = {**good, "created": "2026-11-21T08:30:00+01:00"}
    (res / "ladder" / "hand-named.json").write_text(json.dumps(cet))
    session = {"type": "session", "created": "2026-11-21T12:00:00+00:00",
               "device": {"device": "NVIDIA H200"}, "command": "rnnrt sweep"}
    row = {"type": "row", "cell": "lstm", "layers": 1, "hidden": 128, "input_size": 128,
           "batch": 32, "steps": 100, "input_batch": 10, "rung": "naive", "executor": "graph"}
    (res / "sweep" / "sweep-lstm-nvidia-h200-20261121T120000.jsonl").write_text(
        json.dumps(session) + "\n" + json.dumps(row) + "\n" + '{"type": "row", "cel')
    damaged = {**row, "batch": -4}
    (res / "sweep" / "sweep-gru-nvidia-h200-20261121T120500.jsonl").write_text(
        json.dumps(session) + "\n" + json.dumps(damaged) + "\n" + json.dumps(row) + "\n"
        + "7\n")
    (res / "kernels" / "gemm-layouts-nvidia-h200-20261121T130000.json").write_text("[1, 2]")
    (res / "kernels" / "pretranspose-probe-nvidia-h200-20261121T140000.json").write_text("42")
    (tmp_path / "README.md").write_text(f"see `{SHAPE_H100}-20261121T100000.json`\n")
    return tmp_path  # no CHANGELOG.md, no docs/: their absence must be fine


def _line(text: str, name: str) -> str:
    (line,) = [ln for ln in text.splitlines() if f"[{name}]" in ln]
    return line


def test_damaged_records_become_unreadable_rows(tmp_path):
    text = render_index(_tree(tmp_path))
    for name, reason in [(BROKEN, "not JSON"),
                         ("gemm-layouts-nvidia-h200-20261121T130000.json", "a list"),
                         ("pretranspose-probe-nvidia-h200-20261121T140000.json", "a number")]:
        assert "| unreadable: " in _line(text, name) and reason in _line(text, name), name
    # a sweep cut short by a kill is readable; its damaged lines are skipped and named
    torn = _line(text, "sweep-lstm-nvidia-h200-20261121T120000.jsonl")
    assert "| 1 points, lstm L1, last line cut short |" in torn, torn
    hurt = _line(text, "sweep-gru-nvidia-h200-20261121T120500.jsonl")
    assert ("| 1 points, lstm L1, 2 damaged line(s) skipped (line 2: 'batch' is -4, expected "
            "a positive integer) |") in hurt, hurt
    good = _line(text, f"{SHAPE_H100}-20261121T100000.json")
    assert "unreadable" not in good
    assert "| lstm L4 H512 B64 T100, fwd |" in good and "`rnnrt ladder`" in good
    assert good.endswith("| current | README.md |")
    assert "| 2026-11-21 07:30:00 | NVIDIA H100 80GB HBM3 |" in _line(text, "hand-named.json")
    # Same stem and device, older stamp: superseded; cited nowhere: an em dash.
    assert _line(text, f"{SHAPE_H100}-20261121T090000.json").endswith("| superseded | — |")


def test_check_fails_when_the_index_is_stale(tmp_path, capsys):
    root = _tree(tmp_path)
    assert main(["--check", "--root", str(root)]) == 1  # no INDEX.md yet
    assert main(["--root", str(root)]) == 0
    assert main(["--check", "--root", str(root)]) == 0
    (root / "README.md").write_text("nothing cited\n")  # the cited-by column changes
    assert main(["--check", "--root", str(root)]) == 1
    assert "out of date" in capsys.readouterr().out


def test_record_path_follows_the_scheme_for_gpus_and_cpus():
    """rnnrt.bench.records.record_path: a GPU's name slugged, every CPU name (the NumPy
    executor's, the examples' 'cpu', their CPU runs' 'CPU (...)') 'cpu', the stamp in UTC:
    names the scheme above accepts."""
    from rnnrt.bench.records import device_slug, record_path
    created = "2026-11-21T11:00:00+01:00"
    for device, slug in (("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
                         ("NVIDIA H200, 141 GB", "nvidia-h200"), ("cpu", "cpu"),
                         ("CPU (x86_64), NumPy executor", "cpu"),
                         ("CPU (aarch64), rnnrt.nn.LSTM (NumPy reference) + torch.optim", "cpu")):
        assert device_slug(device) == slug, device
        p = record_path("training", "train-step-lstm-L2-H512-B64-T100", device, created,
                        root=Path("r"))
        assert p == Path("r", "training",
                         f"train-step-lstm-L2-H512-B64-T100-{slug}-20261121T100000.json")
        assert record_name_match("training", p.name), p.name
