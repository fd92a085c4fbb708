"""Why the pre-transposed rung is slower on the H100: time the recurrent and input GEMMs of
the paper's LSTM in both weight layouts through rnnrt's cuBLAS binding.

  plain          out[N, M] = x[N, K] @ W^T, W stored [M, K] (torch's layout) -> cuBLAS "T,N"
  pre-transposed out[N, M] = x[N, K] @ WT,  WT stored [K, M]                  -> cuBLAS "N,N"

Usage (GPU): python experiments/scripts/gemm_layouts.py [--out PATH]. Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rnnrt.bench.timing import time_gpu  # noqa: E402
from rnnrt.session import GpuSession  # noqa: E402

SHAPES = [  # (what, N rows, K, M): out [N, M]
    ("R.h one step (B 64)", 64, 512, 2048),
    ("W.x 10 steps (B 64)", 640, 512, 2048),
    ("W.x 100 steps (B 64)", 6400, 512, 2048),
    ("R.h one step (B 256, H 1024)", 256, 1024, 4096),
    # the small-batch points of the wide grid: the forward's R.h, and the backward's
    # dh = dG.R, whose weight as stored ([4H, H] = [K, M]) is the N,N column and a
    # pre-transposed copy ([H, 4H]) the T,N one (backward.py reads the copy under the
    # pretranspose switch)
    ("R.h one step (LSTM H 128, B 8)", 8, 128, 512),
    ("dG.R one step (LSTM H 128, B 8)", 8, 512, 128),
    ("dG.R one step (GRU H 128, B 8)", 8, 384, 128),
    ("dG.R one step (LSTM H 128, B 32)", 32, 512, 128),
    ("dG.R one step (GRU H 256, B 8)", 8, 768, 256),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args(argv)
    session = GpuSession()
    cp, ctx = session.cp, session.ctx
    stream, handle = ctx.stream(0, 0)
    rng = cp.random.default_rng(0)
    rows = []
    for what, n, k, m in SHAPES:
        x = rng.standard_normal((n, k), dtype=cp.float32)
        w = rng.standard_normal((m, k), dtype=cp.float32)      # torch layout [M, K]
        wt = cp.ascontiguousarray(w.T)                          # [K, M]
        out = cp.empty((n, m), dtype=cp.float32)
        res = {"what": what, "N": n, "K": k, "M": m}
        for name, b, trans_b, ld in (("plain_TN", w, True, k), ("pretransposed_NN", wt, False, m)):
            prep = handle.prepare_gemm(out.data.ptr, m, x.data.ptr, k, b.data.ptr, ld, m, n, k,
                                       trans_b=trans_b)
            # 20 back-to-back GEMMs captured into a CUDA graph: issuing them from Python costs
            # more per call than the GEMM itself (a first version timed eager bursts and
            # measured the host), so only a graph replay times the GPU
            stream.synchronize()
            stream.begin_capture()
            for _ in range(20):
                handle.gemm(prep)
            graph = stream.end_capture()
            t = time_gpu(cp, lambda: graph.launch(stream), stream,
                         repeats=max(5, a.repeats // 20), warmup=3)
            us = t.ms_median * 1e3 / 20
            err = float(abs(out[:3, :5].get() - (x[:3].get() @ w.get().T)[:, :5]).max())
            res[name] = {"us": us, "tflops": 2 * n * k * m / (us * 1e-6) / 1e12, "max_err": err}
        res["nn_over_tn"] = res["pretransposed_NN"]["us"] / res["plain_TN"]["us"]
        rows.append(res)
    rec = {"device": session.info, "command": " ".join(sys.argv), "rows": rows}
    print("| GEMM | N x K x M | plain (TN) us | pre-transposed (NN) us | NN / TN |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} | {r['N']}x{r['K']}x{r['M']} | {r['plain_TN']['us']:.2f} | "
              f"{r['pretransposed_NN']['us']:.2f} | {r['nn_over_tn']:.2f} |")
    if a.out:
        Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")
    ctx.close()


if __name__ == "__main__":
    main()
