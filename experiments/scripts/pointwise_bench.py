"""Issue 24: the pointwise kernels' memory throughput before and after the grid-stride walk
(cuda_src/pointwise_common.cuh: two divisions a thread, not a 64-bit division an element;
ew_copy's batched, 4-wide accesses; transpose's 4 loads a thread issued together) and the
inference step kernel without act (lstm_fwd_noact), at the bf16 wide-grid point L4 H2048
B256: the kernels a bf16 inference pass runs, at their shapes, one launch at a time.

Variants, each compiled here from the checkout's sources (NVRTC, as the library compiles):
  old        the sources with the code this change replaced put back (text substitution:
             the flat-index for_each_element, ew_copy's one-element load-then-store,
             transpose's blockDim.y loop): main's kernels before issue 24, element code alike
  new        the sources as they are (COPY_BATCH 4, the 4-wide copy where aligned)
  new-1wide  ew_copy's 4-wide path switched off (one element an access, batch 4)
  new-b1, new-b8   ew_copy with COPY_BATCH 1 / 8 (-DCOPY_BATCH)
Kernels and shapes (rows x cols; views row-major, ld = cols unless said):
  ew_copy_t<bf16, float>  8192 x 2048: W or R of one layer (4H x H) rounded into its 16-bit
                          copy (8 such copies start every pass of L4 H2048); ew_copy fp32 too
  lstm_fwd_t / lstm_fwd_noact_t<bf16 h, fp32 rest>  256 x 2048: one step (gx, gh [256, 8192];
                          biases one row, ld 0), 400 of them a pass (T100, L4)
  transpose_t<bf16, float>  8192 x 2048 -> 2048 x 8192 (the pretranspose switch's copy)
GB/s = bytes the launch must move (each element read once and written once; a broadcast
bias row once) / its time. Every variant's outputs are checked equal to new's, bit for bit
(the same math), before timing. Timing: CUDA events (rnnrt.bench.timing.time_in_turn: every
variant of a kernel in turn each round, warm-up, median of --repeats), each timed call
--inner launches back to back.

Usage (GPU, repo root): python experiments/scripts/pointwise_bench.py [--out DIR]
  [--repeats 30] [--inner 20]
Prints one line a (kernel, variant) and what the new kernels save a forward pass; with --out
writes DIR/pointwise-bench-H2048-B256-<device>-<stamp>.json (kind 'pointwise_bench'). About a minute on
an H100 (NVRTC compiles included).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_in_turn  # noqa: E402
from rnnrt.kernels.registry import KERNELS, kernel_args  # noqa: E402
from rnnrt.kernels.sources import source  # noqa: E402

H, B, LAYERS, STEPS = 2048, 256, 4, 100
W_ROWS, W_COLS = 4 * H, H          # W_ih (I = H) and W_hh of an LSTM layer
COPIES_A_PASS = 2 * LAYERS          # the 16-bit weight copies at the start of a pass
STEPS_A_PASS = LAYERS * STEPS       # the step kernels of a pass

# --- the code this change replaced (main before issue 24), put back by text ----------------

OLD_FOR_EACH = """template <class F>
__device__ __forceinline__ void for_each_element(int rows, int cols, F f) {
    const long long n = (long long)rows * cols;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long r = i / cols;
        f(r, i - r * cols);
    }
}
"""
OLD_COPY = """template <class TOUT, class TA>
__device__ __forceinline__ void ew_copy_rows(int rows, int cols, TOUT* out, int ldout,
                                             const TA* a, int lda) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        out[r * ldout + c] = from_f<TOUT>(to_f(a[r * lda + c]));
    });
}
"""
OLD_TRANSPOSE_LOOPS = """            for (int k = threadIdx.y; k < TILE; k += blockDim.y) {
                if (r0 + k < rows && c0 + tx < cols) {
                    tile[k][tx] = to_f(in[(r0 + k) * ldin + c0 + tx]);
                }
            }
            __syncthreads();
            for (int k = threadIdx.y; k < TILE; k += blockDim.y) {
                if (c0 + k < cols && r0 + tx < rows) {
                    const float w = tile[tx][k];
                    out[(c0 + k) * ldout + r0 + tx] = from_f<TOUT>(w);
                }
            }
"""


def _replace_function(text, head, body):
    """``text`` with the definition that starts with ``head`` (up to its first closing
    brace at column 0) replaced by ``body``; an error where it is not there once."""
    m = re.search(re.escape(head) + r".*?\n}\n", text, re.S)
    if not m or text.count(head) != 1:
        raise SystemExit(f"pointwise_bench: the sources changed: {head!r} not found once")
    return text[:m.start()] + body + text[m.end():]


def old_source(file):
    text = source(file)
    if file != "transpose.cu":
        text = _replace_function(text, "template <class F>\n__device__ __forceinline__ void "
                                 "for_each_element(", OLD_FOR_EACH)
    if file == "elementwise.cu":
        text = _replace_function(text, "template <class TOUT, class TA>\n__device__ "
                                 "__forceinline__ void ew_copy_rows(", OLD_COPY)
    if file == "transpose.cu":
        start = text.find("            // Read: a warp")
        end = text.find("            __syncthreads();  // the next tile overwrites")
        if start < 0 or end < start:
            raise SystemExit("pointwise_bench: the sources changed: transpose's loops")
        text = text[:start] + OLD_TRANSPOSE_LOOPS + text[end:]
        text = text.replace("    if (blockDim.x != TILE || blockDim.y != TILE_ROWS) __trap();\n",
                            "")
    return text


def variant_source(variant, file):
    """(text, extra NVRTC options) of ``file`` in ``variant``."""
    if variant == "old":
        return old_source(file), ()
    text = source(file)
    if variant == "new-1wide":
        text = text.replace("const bool by4 = ", "const bool by4 = false && ", 1)
        return text, ()
    if variant in ("new-b1", "new-b8"):
        return text, (f"-DCOPY_BATCH={variant[-1]}",)
    return text, ()


# lstm_fwd_t (8 pointers) and lstm_fwd_noact_t (7): h bf16, the rest fp32, as a bf16 plan
BF16_H = "<bf16, float, float, float, float, float, float, float>"
BF16_H_NOACT = "<bf16, float, float, float, float, float, float>"
# (kernel, NVRTC name, rows, cols, element types of the args (out then in), the variants)
CASES = [
    ("ew_copy", "ew_copy_t<bf16, float>", W_ROWS, W_COLS, ("bf16", "f32"),
     ("old", "new", "new-1wide", "new-b1", "new-b8")),
    ("ew_copy", "ew_copy", W_ROWS, W_COLS, ("f32", "f32"), ("old", "new", "new-1wide")),
    ("lstm_fwd", "lstm_fwd_t" + BF16_H, B, H, ("bf16",) + ("f32",) * 7, ("old", "new")),
    ("lstm_fwd_noact", "lstm_fwd_noact_t" + BF16_H_NOACT, B, H, ("bf16",) + ("f32",) * 6,
     ("old", "new")),
    ("transpose", "transpose_t<bf16, float>", W_ROWS, W_COLS, ("bf16", "f32"),
     ("old", "new")),
]
ITEMSIZE = {"bf16": 2, "f32": 4}


class Launch:
    """One kernel's launch on fixed device arrays: inputs random (the biases one row, ld 0),
    outputs zeroed; ``run()`` launches it, ``outputs()`` copies them back."""

    def __init__(self, cp, fn, name, rows, cols, types, rng):
        k = KERNELS[name]
        outs, ins = k.arg_shapes(rows, cols)
        self.arrays, pairs, self.bytes = [], [], 0
        for (arg, _), (r, c), t, is_out in zip(k.outs + k.ins, outs + ins, types,
                                               [True] * k.n_outs + [False] * k.n_ins):
            bcast = arg in ("bw", "br")
            n_rows = 1 if bcast else r
            if is_out:
                a = cp.zeros((n_rows, c), np.uint16 if t == "bf16" else np.float32)
            else:
                host = (2 * rng.standard_normal((n_rows, c))).astype(np.float32)
                a = cp.asarray(host if t == "f32" else
                               (host.view(np.uint32) >> 16).astype(np.uint16))
            self.arrays.append(a)
            pairs.append((int(a.data.ptr), 0 if bcast else c))
            self.bytes += n_rows * c * ITEMSIZE[t]
        self.grid, self.block = k.launch(rows, cols)
        self.args = kernel_args(k, rows, cols, pairs[:k.n_outs], pairs[k.n_outs:])
        self.fn, self.n_outs, self.cp = fn, k.n_outs, cp

    def run(self, times=1):
        for _ in range(times):
            self.fn(self.grid, self.block, self.args)

    def outputs(self):
        self.cp.cuda.Device().synchronize()
        return [a.get() for a in self.arrays[:self.n_outs]]


def main(argv=None) -> int:
    import cupy as cp
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for the JSON record (none: print only)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--inner", type=int, default=20, help="launches a timed call")
    args = ap.parse_args(argv)
    modules = {}

    def kernel_fn(variant, name, expr):
        file = KERNELS[name].file
        if (variant, file) not in modules:
            text, extra = variant_source(variant, file)
            exprs = sorted({e for _, e, *_ in CASES if KERNELS[_kernel(e)].file == file
                            and "<" in e})
            modules[variant, file] = cp.RawModule(code=text, options=("-std=c++17",) + extra,
                                                  name_expressions=exprs)
        return modules[variant, file].get_function(expr)

    stream = cp.cuda.get_current_stream()
    rows_out, times = [], {}
    for name, expr, rows, cols, types, variants in CASES:
        launches = {v: Launch(cp, kernel_fn(v, name, expr), name, rows, cols, types,
                              np.random.default_rng(0)) for v in variants}
        for la in launches.values():
            la.run()
        want = launches["new"].outputs()
        checks = {}
        for v, la in launches.items():
            got = la.outputs()
            checks[v] = all(np.array_equal(g.view(np.uint8), w.view(np.uint8))
                            for g, w in zip(got, want))
        timed = time_in_turn({v: ((lambda la=la: la.run(args.inner)), stream)
                              for v, la in launches.items()},
                             repeats=args.repeats, cp=cp)
        for v, t in timed.items():
            us = 1e3 * t.ms_median / args.inner
            gbps = launches[v].bytes / (us * 1e-6) / 1e9
            times[expr, v] = us
            rows_out.append({"kernel": expr, "variant": v, "rows": rows, "cols": cols,
                             "bytes": launches[v].bytes, "us": us, "gb_s": gbps,
                             "timing": t.as_dict(), "equal_to_new": checks[v]})
            print(f"{expr:<66} {v:<10} {us:9.2f} us {gbps:8.1f} GB/s"
                  f"{'' if checks[v] else '  OUTPUTS DIFFER FROM new'}", flush=True)
    copy, step = CASES[0][1], CASES[2][1]
    noact = CASES[3][1]
    est = {
        "copies_ms_old": COPIES_A_PASS * times[copy, "old"] / 1e3,
        "copies_ms_new": COPIES_A_PASS * times[copy, "new"] / 1e3,
        "steps_ms_old_with_act": STEPS_A_PASS * times[step, "old"] / 1e3,
        "steps_ms_new_with_act": STEPS_A_PASS * times[step, "new"] / 1e3,
        "steps_ms_new_noact": STEPS_A_PASS * times[noact, "new"] / 1e3,
    }
    est["saved_ms_a_pass"] = (est["copies_ms_old"] - est["copies_ms_new"]
                              + est["steps_ms_old_with_act"] - est["steps_ms_new_noact"])
    print(f"\na bf16 inference pass of L{LAYERS} H{H} B{B} T{STEPS} (8 weight copies, "
          f"{STEPS_A_PASS} step kernels; kernel time only, overlap ignored):")
    for k, v in est.items():
        print(f"  {k:<24} {v:8.3f} ms")
    if args.out:
        from rnnrt.session import device_info
        device = device_info()
        record = {"schema": "rnnrt.pointwise_bench/1", "kind": "pointwise_bench",
                  "created": now_iso(), "command": " ".join(sys.argv), "device": device,
                  "versions": versions(cp), "inner": args.inner, "repeats": args.repeats,
                  "rows": rows_out, "estimate": est}
        path = Path(args.out) / (f"pointwise-bench-H2048-B256-{device_slug(device['device'])}-"
                                 f"{stamp(record['created'])}.json")
        write_json(record, path)
        print(f"record: {path}")
    return 0 if all(r["equal_to_new"] for r in rows_out) else 1


def _kernel(expr):
    """The registry name of an NVRTC expression ('ew_copy_t<bf16, float>' -> 'ew_copy')."""
    base = expr.split("<")[0]
    return base[:-2] if base.endswith("_t") else base


if __name__ == "__main__":
    sys.exit(main())
