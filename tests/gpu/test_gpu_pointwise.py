"""The pointwise kernels on the GPU after issue 24 (marker gpu; skipped without a GPU):

- the forward step kernels without act (lstm_fwd_noact, gru_fwd_noact and their masked
  variants; fp32 and the typed twin with a bf16 h, as a 16-bit plan runs them) against the
  float64 reference of the same inputs (fp32 tolerance, worst element reported), outputs
  poisoned with NaN, views with ld != cols and broadcast biases; their h and c equal the
  kernels with act's bit for bit, launched on the same inputs;
- the grid-stride walk (pointwise_common.cuh's element_walk, ew_copy's batched loads) on odd
  sizes, ld != cols, one row, one column, in place, and problems past the grid cap (each
  thread loops): ew_copy fp32 and ew_copy_t<bf16, float> (the weights' 16-bit copy: rounded
  to nearest even, exactly precision.round_to_bfloat16), both its paths (4 elements an
  access where cols, the lds and the pointers allow; else one; a view one element off an
  aligned start takes the second), ew_add and lstm_fwd exactly their NumPy twins' fp32
  results where the math is exact (copy, add), within fp32 tolerance otherwise; nothing
  written outside the views (padding keeps its poison).

About 10 s on an H100 (compiles included). Run: pytest -m gpu tests/gpu/test_gpu_pointwise.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close  # noqa: E402
from rnnrt.kernels import twins as knp  # noqa: E402
from rnnrt.kernels.registry import KERNELS, MAX_POINTWISE_BLOCKS, POINTWISE_BLOCK  # noqa: E402
from rnnrt.kernels.registry import kernel_args  # noqa: E402
from rnnrt.precision import round_to_bfloat16  # noqa: E402

PAD = 5   # ld = cols + PAD for every view but the broadcast biases (Views' default)


def _bf16_bits(a):
    return (round_to_bfloat16(a).view(np.uint32) >> 16).astype(np.uint16)


def _from_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Views:
    """A launch's arguments on the device: each a padded [rows, ld] array (ld = cols + pad,
    or one row with ld 0 for a broadcast input), fp32 or bf16 (uint16 bits); outputs poisoned
    with NaN (bf16: its NaN bits). skew: every view starts that many elements into its
    array (its pointer off the array's alignment)."""

    def __init__(self, cp, name, rows, cols, rng, bf16=(), bcast=(), pad=PAD, skew=0,
                 scalars=None):
        self.cp, self.k, self.scalars = cp, KERNELS[name], scalars
        outs, ins = self.k.arg_shapes(rows, cols, **(scalars or {}))
        self.host, self.dev, self.ld, self.shape, self.types = {}, {}, {}, {}, []
        for (arg, _), (r, c), is_out in ([(a, s, True) for a, s in zip(self.k.outs, outs)]
                                          + [(a, s, False) for a, s in zip(self.k.ins, ins)]):
            ld = 0 if arg in bcast else c + pad
            if is_out:
                v = np.full((r, c + pad), np.nan, np.float32)
            elif arg == "mask":
                v = (np.arange(r) % 3 != 1).astype(np.float32)[:, None]
                v = np.pad(v, ((0, 0), (0, c + pad - 1)), constant_values=np.nan)
            else:
                v = (2 * rng.standard_normal((1 if ld == 0 else r, c + pad))).astype(np.float32)
            if arg in bf16:
                v = _from_bits(_bf16_bits(v))   # the value the bf16 buffer holds
                self.dev[arg] = cp.asarray(_bf16_bits(v))
            else:
                self.dev[arg] = cp.asarray(v)
            self.types.append("bfloat16" if arg in bf16 else "float32")
            self.host[arg], self.ld[arg], self.shape[arg] = v, ld, (r, c)
        self.skew = skew

    def launch(self, lib, rows, cols):
        k = self.k
        pairs = [(int(self.dev[a].data.ptr) + self.skew * self.dev[a].itemsize, self.ld[a])
                 for a, _ in k.outs + k.ins]
        fn = lib.get_typed(k.name, self.types)
        grid, block = k.launch(rows, cols)
        fn(grid, block, kernel_args(k, rows, cols, pairs[:k.n_outs], pairs[k.n_outs:],
                                    self.scalars))
        self.cp.cuda.Device().synchronize()

    def set_input(self, arg, value):
        """Input ``arg`` (fp32 here) as the [rows, ld] host array ``value`` (a copy), on the
        device too."""
        self.host[arg] = np.array(value, np.float32)
        self.dev[arg] = self.cp.asarray(self.host[arg])

    def got(self, arg):
        a = self.dev[arg].get()
        return _from_bits(a) if a.dtype == np.uint16 else a

    def twin(self, rows, cols, dtype=np.float64):
        """{output: [rows, cols'] array} of the kernel's NumPy twin on the host copies of the
        inputs (the values the device holds), in ``dtype``."""
        k = self.k
        outs = [np.full(self.shape[a], np.nan, dtype) for a, _ in k.outs]
        ins = [self._view(a, dtype) for a, _ in k.ins]
        k.numpy_fn(rows, cols, outs, ins, **(self.scalars or {}))
        return {a: o for (a, _), o in zip(k.outs, outs)}

    def _at(self, a, arg):
        """Array ``a`` (the [rows, ld] host layout of ``arg``) as the kernel sees it: the
        [rows, cols] view ``skew`` elements in."""
        r, c = self.shape[arg]
        flat = a.reshape(-1)[self.skew:]
        if self.ld[arg] == 0:
            return np.broadcast_to(flat[:c], (r, c))
        return np.lib.stride_tricks.as_strided(flat, (r, c), (self.ld[arg] * a.itemsize,
                                                              a.itemsize))

    def _view(self, arg, dtype):
        return self._at(self.host[arg], arg).astype(dtype)

    def out(self, arg):
        """Output ``arg`` as the kernel addresses it (its padding left out)."""
        return np.array(self._at(self.got(arg), arg))

    def check_untouched_padding(self, arg):
        a = self.got(arg)
        written = np.zeros(a.size, bool)
        r, c = self.shape[arg]
        for i in range(r):
            written[self.skew + i * self.ld[arg]:self.skew + i * self.ld[arg] + c] = True
        assert np.isnan(a.reshape(-1)[~written]).all(), f"{self.k.name}: wrote outside {arg}"


NOACT = {"lstm_fwd_noact": "lstm_fwd", "gru_fwd_noact": "gru_fwd",
         "lstm_fwd_mask_noact": "lstm_fwd_mask", "gru_fwd_mask_noact": "gru_fwd_mask"}


COPY_TYPES = [("float32", "float32"), ("bfloat16", "float32"), ("float32", "bfloat16")]


@pytest.fixture(scope="module")
def lib(cp):
    """A KernelLibrary with every typed twin the module launches compiled up front (one
    NVRTC compile a file, not one a twin)."""
    from rnnrt.kernels.library import KernelLibrary
    lib = KernelLibrary()
    lib.instantiate([(name, ["bfloat16" if a in ("h", "h_prev") else "float32"
                             for a, _ in KERNELS[name].outs + KERNELS[name].ins])
                     for name in sorted(NOACT)] + [("ew_copy", ts) for ts in COPY_TYPES]
                    + [(name, ["bfloat16" if a in SPLIT_BF16 else "float32"
                               for a, _ in KERNELS[name].outs + KERNELS[name].ins])
                       for plain in SPLIT for name in (plain, f"{plain}_split")])
    return lib


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-h"])
@pytest.mark.parametrize("shape", [(7, 33), (64, 512), (3, 1)], ids=["7x33", "64x512", "3x1"])
@pytest.mark.parametrize("name", sorted(NOACT))
def test_noact_kernels_against_the_reference(cp, lib, name, shape, bf16):
    rows, cols = shape
    kw = dict(bf16=("h", "h_prev") if bf16 else (), bcast=("bw", "br"))
    v = Views(cp, name, rows, cols, np.random.default_rng(rows), **kw)
    v.launch(lib, rows, cols)
    ref = v.twin(rows, cols)
    for arg, want in ref.items():
        got = v.out(arg)
        if arg == "h" and bf16:   # one more rounding: the bf16 store
            want = round_to_bfloat16(want).astype(np.float64)
            assert_close(got, want, FP32_ATOL, 1e-2, name=f"{name} {arg}")
        else:
            assert_close(got, want, FP32_ATOL, FP32_RTOL, name=f"{name} {arg}")
        v.check_untouched_padding(arg)
    # the kernel with act on the same inputs: the same h and c, bit for bit
    w = Views(cp, NOACT[name], rows, cols, np.random.default_rng(rows), **kw)
    w.launch(lib, rows, cols)
    for arg in ref:
        a, b = v.out(arg), w.out(arg)
        assert (a.view(np.uint32) == b.view(np.uint32)).all(), f"{name} {arg} != {NOACT[name]}'s"


SPLIT = ("lstm_bwd", "gru_bwd", "rnn_tanh_bwd", "rnn_relu_bwd", "lstm_bwd_mask", "gru_bwd_mask",
         "rnn_tanh_bwd_mask", "rnn_relu_bwd_mask")
# a 16-bit plan's typed twins: the gate gradients and h in the storage type
SPLIT_BF16 = ("dgx", "dgh", "dg", "h", "h_prev")


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-dg-h"])
@pytest.mark.parametrize("splits", [1, 4, 15])
@pytest.mark.parametrize("shape", [(7, 33), (64, 512), (3, 1)], ids=["7x33", "64x512", "3x1"])
@pytest.mark.parametrize("plain", SPLIT)
def test_split_kernels_are_the_sum_then_the_plain_kernel(cp, lib, plain, shape, splits, bf16):
    """*_bwd_split on (base, parts) gives bit for bit what the plain kernel gives on dh_rec =
    base + parts[0] + ... + parts[splits - 1] summed in that order in fp32 (ew_sum_splits's
    sum; NumPy's fp32 adds round as the GPU's; the masked kernels' over the first part_rows
    = rows - 1 rows, base alone past them), views padded (ld != cols), outputs poisoned,
    nothing written outside them; and within fp32 tolerance of the plain kernel's float64 twin
    on that sum."""
    rows, cols = shape
    name = f"{plain}_split"
    bf = SPLIT_BF16 if bf16 else ()
    p = max(1, rows - 1) if plain.endswith("_mask") else rows   # the parts' rows
    scalars = {"splits": splits, **({"part_rows": p} if plain.endswith("_mask") else {})}
    v = Views(cp, name, rows, cols, np.random.default_rng(splits + rows), bf16=bf,
              scalars=scalars)
    v.set_input("parts", v.host["parts"] / splits)   # dh_rec about the others' size
    v.launch(lib, rows, cols)
    base, parts = v._view("dh_rec", np.float32), v._view("parts", np.float32)
    rec = base.copy()
    for k in range(splits):
        rec[:p] += parts[k * p:(k + 1) * p]
    w = Views(cp, plain, rows, cols, np.random.default_rng(0), bf16=bf)
    for arg, _ in w.k.ins:
        value = rec if arg == "dh_rec" else v._view(arg, np.float32)
        if arg in bf:   # the same 16-bit values
            w.host[arg] = value
            w.dev[arg] = cp.asarray(_bf16_bits(value))
        else:
            w.set_input(arg, value)
        w.ld[arg] = value.shape[1]   # the host array is the view itself, unpadded
    w.launch(lib, rows, cols)
    # the sum against float64's, then the pointwise math against the float64 twin of the
    # plain kernel on that fp32 sum (with act's random values far outside the gates' range,
    # the formula amplifies a last-bit difference in dh_rec by ~10^4: comparing the split
    # twin's float64 sum would test that amplification, not the kernel)
    want = base.astype(np.float64)
    want[:p] += parts.astype(np.float64).reshape(splits, p, cols).sum(axis=0)
    assert_close(rec, want, 1e-5, 1e-5, name=f"{name} sum")
    ref = w.twin(rows, cols)
    for arg, _ in v.k.outs:
        a, b = v.out(arg), w.out(arg)
        assert (a.view(np.uint32) == b.view(np.uint32)).all(), f"{name} {arg} != {plain}'s"
        want = ref[arg]
        if arg in bf:
            want = round_to_bfloat16(want).astype(np.float64)
        # (2e-4, 2e-3): fp32 against float64 on random act far outside the gates' range
        # (NumPy's fp32 lstm_bwd twin on such data, 40 seeds of 64 x 512: worst 1.0x of
        # (1e-4, 1e-3)); bf16 outputs: one rounding more
        assert_close(a, want, 2e-4, 1e-2 if arg in bf else 2e-3, name=f"{name} {arg}")
        v.check_untouched_padding(arg)


# shapes for the walk: odd, one row / one column, and past the grid cap (rows*cols above
# MAX_POINTWISE_BLOCKS * POINTWISE_BLOCK, so threads loop several times)
CAP = MAX_POINTWISE_BLOCKS * POINTWISE_BLOCK
WALK = [(1, 1), (1, 1031), (1031, 1), (5, 7), (37, 255), (3, 257), (1031, 2049)]


def test_the_walk_shapes_pass_the_grid_cap():
    assert max(r * c for r, c in WALK) > 2 * CAP


# the copy's 4-an-access path: cols and ld multiples of 4 (pad 0 or 4), pointers aligned
ALIGNED = [(1, 4), (3, 8), (64, 1024), (1031, 2048)]
COPY_CASES = ([(s, PAD, 0) for s in WALK] + [(s, 0, 0) for s in ALIGNED]
              + [(s, 4, 0) for s in ALIGNED] + [(s, 4, 1) for s in ALIGNED])


@pytest.mark.parametrize("shape, pad, skew", COPY_CASES,
                         ids=[f"{r}x{c}-pad{p}-skew{s}" for (r, c), p, s in COPY_CASES])
@pytest.mark.parametrize("types", COPY_TYPES, ids=["fp32", "bf16<-fp32", "fp32<-bf16"])
def test_ew_copy_exact_on_odd_shapes(cp, lib, types, shape, pad, skew):
    """The weights' copies (bf16 <- fp32), fp32 copies, and a 16-bit plan's final states
    (fp32 <- bf16: a widening, exact)."""
    rows, cols = shape
    bf16 = [a for a, ty in zip(("out", "a"), types) if ty == "bfloat16"]
    v = Views(cp, "ew_copy", rows, cols, np.random.default_rng(cols), bf16=bf16, pad=pad,
              skew=skew)
    v.launch(lib, rows, cols)
    want = v._view("a", np.float32)
    if types[0] == "bfloat16":   # round to nearest even, as precision rounds
        want = round_to_bfloat16(want)
    got = v.out("out")
    same = got.view(np.uint32) == want.view(np.uint32)
    assert same.all(), f"ew_copy {types} {shape}: {int((~same).sum())} elements differ, " \
                       f"first at {np.argwhere(~same)[0]}"
    v.check_untouched_padding("out")


@pytest.mark.parametrize("shape", WALK, ids=[f"{r}x{c}" for r, c in WALK])
def test_ew_copy_in_place_and_ew_add_exact(cp, lib, shape):
    """ew_copy with out = a (the same view: each element read before it is written) leaves
    a as it was; ew_add equals NumPy's fp32 sum exactly (one rounding)."""
    rows, cols = shape
    rng = np.random.default_rng(rows + cols)
    a = (rng.standard_normal((rows, cols + PAD))).astype(np.float32)
    d = cp.asarray(a)
    k = KERNELS["ew_copy"]
    grid, block = k.launch(rows, cols)
    pair = (int(d.data.ptr), cols + PAD)
    lib.get("ew_copy")(grid, block, kernel_args(k, rows, cols, [pair], [pair]))
    cp.cuda.Device().synchronize()
    assert (d.get().view(np.uint32) == a.view(np.uint32)).all(), "in-place copy changed a"
    v = Views(cp, "ew_add", rows, cols, rng)
    v.launch(lib, rows, cols)
    want = v.twin(rows, cols, np.float32)["out"]
    got = v.out("out")
    assert (got.view(np.uint32) == want.view(np.uint32)).all(), f"ew_add {shape}"
    v.check_untouched_padding("out")


@pytest.mark.parametrize("shape", [(1031, 2049), (5, 7), (1, 1)], ids=["cap", "odd", "one"])
def test_lstm_fwd_past_the_grid_cap(cp, lib, shape):
    """lstm_fwd over a problem the grid covers several times (and tiny ones): every output,
    act included, against the float64 reference; padding untouched."""
    rows, cols = shape
    v = Views(cp, "lstm_fwd", rows, cols, np.random.default_rng(3), bcast=("bw", "br"))
    v.launch(lib, rows, cols)
    for arg, want in v.twin(rows, cols).items():
        assert_close(v.out(arg), want, FP32_ATOL, FP32_RTOL, name=f"lstm_fwd {arg}")
        v.check_untouched_padding(arg)
