"""The CUDA sources (cuda_src/, rnnrt/kernels/sources.py), checked without a GPU.

- every cuda_src/*.cu compiles for sm_90 with nvcc, and with NVRTC where its library is
  found (the way CuPy will compile it: the text ``sources.source`` gives, no includes);
- each file's header, its `extern "C" __global__` definitions and the registry agree on the
  kernels and their arguments; the shared device helpers are written once (sigmoidf twice,
  identical), and so is the cells' pointwise backward (cell_bwd.cuh);
- cuda_src_dir is the checkout's.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from rnnrt.kernels import registry as K
from rnnrt.kernels import sources as S
from rnnrt.kernels import typed
from testkit import find_nvrtc, nvrtc_compile

CU_FILES = sorted(p.name for p in S.cuda_src_dir().glob("*.cu"))
REPO = Path(S.__file__).resolve().parents[2]


# --- compiling ----------------------------------------------------------------------------

@pytest.mark.parametrize("file", CU_FILES)
def test_nvcc_compiles_sm90(file, nvcc_sm90):
    nvcc_sm90(file)   # -Werror all-warnings; conftest.py keeps the compile for other tests




@pytest.mark.parametrize("file", CU_FILES)
def test_compiles_as_nvrtc_sees_it(file):
    text = S.source(file)
    includes = [ln for ln in text.splitlines() if ln.lstrip().startswith("#include")]
    assert not includes, f"{file}: NVRTC (CuPy RawModule) has no host headers: {includes}"
    lib = find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc to run this check)")
    ok, log = nvrtc_compile(lib, text, file, ["-std=c++17", "--gpu-architecture=sm_90"])
    assert ok, f"{file}: NVRTC failed:\n{log}"
    assert "warning" not in log.lower(), f"{file}: NVRTC warnings:\n{log}"


# --- headers, code and registry agree -----------------------------------------------------

_DEFINITION = re.compile(r'extern\s+"C"\s+__global__\s+void\s+'
                         r'(?:__launch_bounds__\s*\([^)]*\)\s+)?'
                         r'(?:__cluster_dims__\s*\([^)]*\)\s+)?(\w+)\s*\(([^)]*)\)', re.S)


# the typed-only files' kernels (typed.MMA_FILES): template <class TS, bool TF32> K_t(...),
# h or dgx a TS* (read as the registry's float* output)
_TYPED_DEFINITION = re.compile(r'template\s*<class TS, bool TF32>\s*__global__\s+void\s+'
                               r'(?:__launch_bounds__\s*\([^)]*\)\s+)?'
                               r'(?:__cluster_dims__\s*\([^)]*\)\s+)?(\w+)_t\s*\(([^)]*)\)',
                               re.S)


def _file_signatures(file, text):
    """_signatures of ``file``: its `extern "C"` kernels, or for a typed-only file
    (typed.MMA_FILES) its template kernels K_t, named K, TS* read as float*."""
    if file not in typed.MMA_FILES:
        return _signatures(text)
    return _signatures(text.replace("TS*", "float*"), _TYPED_DEFINITION)


def _signatures(text, definition=None):
    """{kernel: (outs, ins, scalars, uint pointers)} from the `extern "C" __global__`
    signatures, checking the calling convention on the way: int rows, int cols, then
    (pointer, int ld) pairs, non-const outputs before const float* inputs, then int scalars.
    Outputs are float*, or unsigned int* (returned as the uint pointers: barrier counters)."""
    found = {}
    for name, params in (definition or _DEFINITION).findall(text):
        ps = [" ".join(p.split()) for p in params.split(",")]
        assert ps[:2] == ["int rows", "int cols"], f"{name}: starts with {ps[:2]}"
        outs, ins, scalars, uints = [], [], [], []
        rest = ps[2:]
        while rest and "*" in rest[0]:
            assert len(rest) > 1, f"{name}: {rest[0]!r} without its ld"
            ptr, ld = rest[0], rest[1]
            assert ld.startswith("int "), f"{name}: {ptr!r} is followed by {ld!r}, not an int ld"
            *qual, pname = ptr.replace("*", " * ").split()
            qual = [q for q in qual if q != "__restrict__"]
            if qual in (["float", "*"], ["unsigned", "int", "*"]):
                assert not ins, f"{name}: output {pname} after an input"
                outs.append(pname)
                if qual[0] == "unsigned":
                    uints.append(pname)
            else:
                assert qual == ["const", "float", "*"], f"{name}: {ptr!r} is not a float pointer"
                ins.append(pname)
            rest = rest[2:]
        for p in rest:
            typ, _, sname = p.partition(" ")
            assert typ == "int" and re.fullmatch(r"\w+", sname), \
                f"{name}: {p!r} after the pairs is not an int scalar"
            scalars.append(sname)
        found[name] = (tuple(outs), tuple(ins), tuple(scalars), tuple(uints))
    return found


def _definitions(text):
    """{kernel: ((output names), (input names))} from the signatures (see _signatures)."""
    return {k: (o, i) for k, (o, i, _, _) in _signatures(text).items()}


@pytest.mark.parametrize("file", CU_FILES)
def test_header_lists_what_the_file_defines(file):
    text = S.source(file)
    header = S.parse_header(text)
    code = {k: (o, i) for k, (o, i, _, _) in _file_signatures(file, text).items()}
    assert list(header) == list(code), \
        f"{file}: header lists {list(header)}, code defines {list(code)}"
    assert S.header_kernels(file) == list(code)
    for name, (outs, ins) in code.items():
        assert header[name] == (outs, ins), \
            f"{file}: {name}: header args {header[name]} != code {(outs, ins)}"
        kinfo = K.KERNELS.get(name)
        assert kinfo is not None, f"{file}: {name} is not in the registry"
        assert kinfo.file == file
        reg = (tuple(a for a, _ in kinfo.outs), tuple(a for a, _ in kinfo.ins))
        assert reg == (outs, ins), f"{name}: registry args {reg} != code {(outs, ins)}"
    # scalars after the pairs, and the unsigned int* pointers: header, code and registry
    header_scalars = S.parse_header_scalars(text)
    for name, (_, _, scalars, uints) in _file_signatures(file, text).items():
        kinfo = K.KERNELS[name]
        assert header_scalars[name] == scalars == kinfo.scalars, \
            f"{name}: scalars header {header_scalars[name]}, code {scalars}, " \
            f"registry {kinfo.scalars}"
        assert uints == kinfo.uint_args, f"{name}: unsigned int* {uints} != {kinfo.uint_args}"
        assert kinfo.persistent == file.startswith("persistent")


def test_headers_and_registry_list_the_same_kernels():
    in_headers = [k for f in CU_FILES for k in S.header_kernels(f)]
    assert len(in_headers) == len(set(in_headers)), f"a kernel listed twice: {in_headers}"
    assert set(in_headers) == set(K.KERNELS)
    assert set(K.kernel_files()) == set(CU_FILES)
    assert [k.name for k in K.REGISTRY] == list(K.KERNELS)


def _helper(text, name):
    m = re.search(r"(template <class F>\n)?__device__ __forceinline__ \w+ " + name + r"\(.*?\n}\n",
                  text, re.S)
    return m and m[0]


@pytest.mark.parametrize("helper, where", [
    ("for_each_element", ["pointwise_common.cuh"]),
    ("sigmoidf", ["persistent_common.cuh", "pointwise_common.cuh"])])
def test_device_helpers_are_written_once_or_identical(helper, where):
    """The pointwise files share pointwise_common.cuh's helpers; sigmoidf's one other copy
    (persistent_common.cuh: the forward persistent kernels' code stays as measured) is the
    same text; every file's inlined source that defines a helper has that one text."""
    folder = S.cuda_src_dir()
    defined = sorted(p.name for p in folder.glob("*.cu*") if _helper(p.read_text(), helper))
    assert defined == where, f"{helper} is defined in {defined}"
    copies = {f: _helper(S.source(f), helper) for f in CU_FILES}
    copies = {f: c for f, c in copies.items() if c}
    first = _helper((folder / where[0]).read_text(), helper)
    assert all(c == first for c in copies.values()), f"{helper} differs between {sorted(copies)}"


def test_pointwise_backward_is_written_once():
    """The cells' pointwise backward arithmetic is cell_bwd.cuh's alone: the fused kernels'
    *_bwd_element (lstm.cu, gru.cu, rnn.cu), the persistent backward's body
    (persistent_bwd.cuh: persistent_bwd.cu's and persistent_mma_bwd.cu's kernels) and the
    stack backward kernels' pointwise (persistent_stack_bwd.cuh) include it and call its
    functions, and the
    non-contracted operations that pin its rounding (__fadd_rn, __fsub_rn) appear in no
    other file."""
    calls = {"lstm.cu": ["lstm_bwd_point("], "gru.cu": ["gru_bwd_point("],
             "rnn.cu": ["rnn_bwd_point<RELU>("],
             "persistent_bwd.cuh": ["lstm_bwd_point(", "gru_bwd_point(", "rnn_bwd_point<"],
             "persistent_stack_bwd.cuh": ["lstm_bwd_point("]}
    folder = S.cuda_src_dir()
    for file, names in calls.items():
        text = (folder / file).read_text()
        assert '#include "cell_bwd.cuh"' in text, f"{file} does not include cell_bwd.cuh"
        for name in names:
            assert name in text, f"{file} does not call {name}"
    for file in ("lstm.cu", "gru.cu", "rnn.cu", "persistent_bwd.cu", "persistent_mma_bwd.cu",
                 "persistent_stack_bwd.cu", "persistent_stack_bwd_pair.cu"):
        assert "cell_bwd.cuh (inlined" in S.source(file), f"{file}: the loader did not inline it"
    for p in sorted(folder.glob("*.cu*")):
        if p.name != "cell_bwd.cuh":
            code = re.sub(r"//[^\n]*|/\*.*?\*/", "", p.read_text(), flags=re.S)
            assert not re.search(r"__f(add|sub)_rn\(", code), f"{p.name}: backward arithmetic"


# --- where the sources are -------------------------------------------------------------------

def test_cuda_src_dir_is_the_checkout():
    assert S.cuda_src_dir() == REPO / "cuda_src"
    assert all((S.cuda_src_dir() / f).is_file() for f in K.kernel_files())

