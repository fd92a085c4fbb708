"""rnnrt.precision: the names a dtype takes and the storage rounding the reference and the
NumPy executor apply (checked against torch's own conversions, bit for bit)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rnnrt.precision import DTYPES, get_precision, round_to_bfloat16, round_to_storage


def _values():
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(200_000) * np.exp(rng.uniform(-30, 30, 200_000))).astype(np.float32)
    a[:6] = [np.inf, -np.inf, np.nan, 3.4e38, 1e-40, -0.0]
    return a


@pytest.mark.parametrize("dtype,torch_dtype", [("bfloat16", torch.bfloat16),
                                               ("float16", torch.float16)])
def test_rounding_matches_torch_bit_for_bit(dtype, torch_dtype):
    a = _values()
    want = torch.from_numpy(a).to(torch_dtype).double().numpy()
    got = round_to_storage(a.astype(np.float64), dtype)
    assert got.dtype == np.float64
    assert np.array_equal(got, want, equal_nan=True)
    finite = ~np.isnan(want)   # a NaN's sign is not specified
    assert np.array_equal(np.signbit(got[finite]), np.signbit(want[finite]))


def test_ties_go_to_even():
    # 1 + 2^-8 is halfway between bfloat16's 1 and 1 + 2^-7: to even (1); 1 + 3*2^-8 up
    a = np.array([1 + 2**-8, 1 + 3 * 2**-8], np.float32)
    assert round_to_bfloat16(a).tolist() == [1.0, 1 + 2**-6]


@pytest.mark.parametrize("dtype", ["float32", "tf32"])
def test_fp32_storage_does_not_round(dtype):
    a = _values().astype(np.float64)
    assert round_to_storage(a, dtype) is not None
    assert np.array_equal(round_to_storage(a, dtype), a, equal_nan=True)


def test_names_and_refusals():
    assert DTYPES[0] == "float32" and set(DTYPES) == {"float32", "tf32", "bfloat16", "float16"}
    assert [get_precision(d).itemsize for d in DTYPES] == [4, 4, 2, 2]
    for bad in ("bf16", "half", None, np.float16):
        with pytest.raises(ValueError, match=r"dtype: expected one of \['float32', 'tf32'"):
            get_precision(bad)
