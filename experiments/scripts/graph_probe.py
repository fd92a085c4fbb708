"""What a rung's CUDA graph holds, and what it costs: capture the forward plan of each named
ladder rung, count the graph's nodes by type and kernel name (CuPy's debug_dot_str, when this
CuPy has it) and time the replay (CUDA events, median). Written to find why +pretranspose is
slower than +fused with graphs but not eagerly (docs/journal.md).

Usage (GPU): python experiments/scripts/graph_probe.py [--rungs +fused,+pretranspose] [--steps 100]
             [--switches "grouped,fused;grouped,fused,pretranspose"] [--out DIR]
  --switches: extra switch sets (';' between sets, ',' between switch names, ib=K for
  input batching), timed after the rungs. DIR gets probe.json and one .dot per entry.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt.bench.ladder import LadderConfig, RungRun, inputs_for, model_for  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402
from rnnrt.bench.trace import traced_rungs  # noqa: E402
from rnnrt.plan.switches import Rung, Switches  # noqa: E402
from rnnrt.session import GpuSession  # noqa: E402


def parse_switch_sets(text: str) -> list:
    """'grouped,fused;grouped,fused,ib=10' -> [Rung('grouped+fused', ...), ...]."""
    rungs = []
    for item in filter(None, (t.strip() for t in text.split(";"))):
        kw = {}
        for name in filter(None, (n.strip() for n in item.split(","))):
            if name.startswith("ib="):
                v = name[3:]
                kw["input_batch"] = v if v == "all" else int(v)
            else:
                kw[name] = True
        sw = Switches(**kw)
        rungs.append(Rung(sw.label(), sw))
    return rungs

def summarize_dot(dot: str) -> dict:
    """Graph nodes by label: CUDA's DOT names a kernel node 'index\\nkernel name' (not a
    documented format, so best effort); everything else is counted under its first line."""
    names = re.findall(r'label="\d+\n([^\n"]+)', dot)
    counts = collections.Counter(names)
    return {"nodes": len(re.findall(r'^"graph_\d+_node_\d+"\[', dot, re.M)),
            "edges": dot.count("->"), "kernels": dict(counts.most_common(12))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rungs", default="+fused,+pretranspose")
    ap.add_argument("--switches", default="")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    session = GpuSession()
    cp = session.cp
    cfg = LadderConfig(steps=a.steps, executors=("graph",))
    model = model_for(cfg, np.float32)
    inputs = inputs_for(cfg, np.float32)
    params = cp.asarray(model.flat)
    limits = session.limits
    out = Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    rec = {"device": session.info, "command": " ".join(sys.argv), "steps": a.steps,
           "rungs": []}
    rungs = list(traced_rungs(cfg.input_batch, [n.strip() for n in a.rungs.split(",")])) \
        if a.rungs else []
    for rung in rungs + parse_switch_sets(a.switches):
        rr = RungRun(cfg, rung, cp, lambda plan, ws: session.executor("graph", plan, ws), params,
                      inputs, limits)
        t = time_gpu(cp, rr.run, rr.stream, a.repeats, 3)
        entry = {"rung": rung.name, "ms_median": t.ms_median, "ms_min": t.ms_min,
                 "plan": rr.plan_summary()}
        g = rr.executors[0].graph
        try:
            dot = g.debug_dot_str()
            entry.update(summarize_dot(dot))
            if out:
                (out / f"{rung.name.strip('+').replace('+', '_')}.dot").write_text(dot)
        except Exception as e:  # noqa: BLE001 - older CuPy: no DOT, timings only
            entry["dot_error"] = repr(e)
        rec["rungs"].append(entry)
        print(f"{rung.name:14s} {t.ms_median:8.3f} ms  {entry.get('nodes')} nodes  "
              f"{entry.get('kernels')}", flush=True)
        del rr
    if out:
        (out / "probe.json").write_text(json.dumps(rec, indent=1) + "\n")
    session.close()


if __name__ == "__main__":
    main()
