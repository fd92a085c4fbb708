"""The ladder's record as a reader sees it: the paper's Table 1 as a markdown table
(``markdown_table``) and where a record goes (``default_path``, ``write_record``). The run
itself is bench/ladder.py's."""
from __future__ import annotations

from pathlib import Path

from ..plan.switches import PAPER_RUNGS, rung_names
from .dtypes import CUDNN_MODE, PRECISION_WORDS, dtype_suffix
from .records import record_path, write_json


def _fmt(v, spec):
    return "—" if v is None else format(v, spec)


def markdown_table(record: dict) -> str:
    """The paper's Table 1 shape: one row per rung, per executor ms / TFLOPS / x naive /
    vs cuDNN / % of the fp32 ceiling; the cuDNN row last."""
    rows = [r for r in record["rows"] if r["rung"] != "cudnn"]
    executors = list(dict.fromkeys(r["executor"] for r in rows))
    head = ["rung"]
    for e in executors:
        head += [f"{e} ms", f"{e} TFLOPS", f"{e} x naive", f"{e} vs cuDNN", f"{e} % ceiling"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    beyond = set(rung_names()[PAPER_RUNGS:])
    notes = []
    for name in dict.fromkeys(r["rung"] for r in rows):
        cells = [name + (" (beyond the paper)" if name in beyond else "")]
        picked = sorted({r["schedule"] for r in rows if r["rung"] == name and r.get("schedule")})
        if picked:
            cells[0] += f" (chose {', '.join(picked)})"
        fb = next((r["fallback"] for r in rows if r["rung"] == name and r.get("fallback")),
                  None)
        if fb:
            cells[0] += " (fell back)"
            notes.append(f"{name}: {fb}.")
        for e in executors:
            r = next((r for r in rows if r["rung"] == name and r["executor"] == e), None)
            if r is None or "refused" in r:
                cells += ["refused" if r else "—"] + ["—"] * 4
                continue
            share = r.get("share_of_ceiling")
            cells += [_fmt(r["ms_median"], ".3f"), _fmt(r["tflops"], ".3g"),
                      _fmt(r["speedup_vs_naive"], ".2f"), _fmt(r["ratio_vs_cudnn"], ".2f"),
                      _fmt(None if share is None else 100 * share, ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    cd = record["cudnn"]
    dtype = record.get("dtype", "float32")
    if "ms_median" in cd:
        cells = [f"cuDNN (torch.nn, {CUDNN_MODE[dtype]})"]
        for _ in executors:
            cells += [_fmt(cd["ms_median"], ".3f"), _fmt(cd["tflops"], ".3g"), "—", "1.00",
                      _fmt(100 * cd["share_of_ceiling"], ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    c = record["config"]
    lines.append("")
    lines.append(f"{c['cell'].upper()}, {c['layers']} layers, hidden {c['hidden']}, input "
                 f"{c['input_size']}, minibatch {c['batch']}, {c['steps']} steps, "
                 f"{PRECISION_WORDS[dtype]}; "
                 f"input batching k = {c['input_batch']}; median of {c['repeats']} runs. "
                 f"Device: {record['device'].get('device')}. Ceiling: "
                 f"{record['ceiling']['what']} = {record['ceiling']['tflops']:.1f} TFLOPS. "
                 f"cuDNN: {_cudnn_note(record['cudnn'])}.")
    lines += [""] + notes if notes else []
    return "\n".join(lines)


def _cudnn_note(cd: dict) -> str:
    if "skipped" in cd:
        return cd["skipped"]
    per = " / ".join(f"{m:.3f}" for m in cd.get("ms_median_per_timing", []))
    mode = CUDNN_MODE[cd.get("dtype", "float32")]
    if cd.get("pooled_over_processes"):   # bench/processes.py
        return f"in each process beside the rows, {mode}, the median of the processes' ({per} ms)"
    return (f"same process, {mode}, median of its medians timed before and after the rungs "
            f"({per} ms)")


def default_path(record: dict, root: Path | None = None) -> Path:
    """Where ``record`` goes by default: results/ladder/ladder-<shape>-<pass>-<device>-<stamp>
    .json (bench/records.py's scheme)."""
    c = record["config"]
    stem = (f"ladder-{c['cell']}-L{c['layers']}-H{c['hidden']}-B{c['batch']}-T{c['steps']}-"
            f"{record['pass'].replace('+', '')}" + dtype_suffix(record.get("dtype")))
    return record_path("ladder", stem, record["device"].get("device", "cpu"), record["created"],
                       root=root)


def write_record(record: dict, path: Path | None = None, overwrite: bool = True) -> Path:
    """Write the record (atomically) to ``path`` or its default path; the path written.
    ``overwrite=False``: FileExistsError where the file exists."""
    return write_json(record, Path(path) if path else default_path(record), overwrite=overwrite)
