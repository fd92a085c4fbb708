"""cuDNN through torch.nn, timed in the same process as rnnrt's rungs: the reference the
ladder and the sweep compare with, at the run's precision (``cfg.dtype``, precision.DTYPES):

  float32    fp32 module and inputs, TF32 off (cuDNN's and cuBLAS's: true fp32 math)
  tf32       fp32 module and inputs, TF32 on (torch.backends.cudnn.allow_tf32 and
             torch.backends.cuda.matmul.allow_tf32)
  bfloat16   the module (``.to(torch.bfloat16)``), x, h0, c0 and dy in bfloat16: cuDNN's
  float16    own 16-bit RNN, as a user of torch.nn in that dtype runs it (its gradients
             come back in that dtype too)

Outputs are returned as float32 arrays (16-bit values are exact in float32)."""
from __future__ import annotations

import statistics

import numpy as np

from ..cells import tflops
from ..params import to_flat
from .timing import time_torch


class CudnnBench:
    """cuDNN through torch.nn holding the same weights (rnnrt's torch-compatible state_dict),
    at precision ``cfg.dtype`` (module docstring). ``time()`` can be called several times
    in a run (before and after the rungs):
    cuDNN's time moves between calls far more than ours (on the H100 its paper-shape forward
    took 5.6 to 11.8 ms across processes), so the row pools every sample."""

    def __init__(self, cfg, model, x, h0, c0, dy, dtype: str | None = None):
        import torch
        self.torch, self.cfg, self.layout = torch, cfg, model.layout
        # dtype: the precision, where it is not cfg's (float32_outputs)
        self.dtype = dtype or getattr(cfg, "dtype", "float32")
        tdt = TORCH_DTYPES[self.dtype](torch)
        self.module = torch_module(torch, model, self.dtype, "cuda")
        self.x = torch.from_numpy(x).cuda().to(tdt)
        hx = torch.from_numpy(h0).cuda().to(tdt)
        self.hx = hx if c0 is None else (hx, torch.from_numpy(c0).cuda().to(tdt))
        self.dy = torch.from_numpy(dy).cuda().to(tdt)
        self.names = [n for n, _ in self.module.named_parameters()]
        self.x.requires_grad_(cfg.backward)
        self.medians, self.samples = [], []

    def run(self):
        """Forward (no autograd), or forward + backward through autograd (dx and every
        parameter's gradient for the seed dy), as a training step would."""
        torch = self.torch
        if not self.cfg.backward:
            with torch.no_grad():
                return self.module(self.x, self.hx)
        y, _ = self.module(self.x, self.hx)
        grads = torch.autograd.grad(y, [self.x] + list(self.module.parameters()), self.dy)
        return y, grads

    def outputs(self) -> dict:
        """The arrays the ladder checks: {'y'} (+ {'dx', 'grads'} flat in rnnrt's layout)."""
        y, extra = self.run()
        self.torch.cuda.synchronize()
        def host(t):
            return t.detach().float().cpu().numpy()

        out = {"y": host(y)}
        if self.cfg.backward:
            out["dx"] = host(extra[0])
            out["grads"] = to_flat({n: host(g) for n, g in zip(self.names, extra[1:])},
                                   self.layout)
        return out

    def time(self):
        """A timing of its own (warm-up, then the median of cfg.repeats runs), pooled."""
        t = time_torch(self.torch, self.run, self.cfg.repeats, self.cfg.warmup)
        self.medians.append(t.ms_median)
        self.samples += [t.ms_min, t.ms_median, t.ms_max]
        return t

    def add_samples(self, samples) -> None:
        """Runs timed elsewhere (interleaved) pooled as one more timing."""
        self.medians.append(statistics.median(samples))
        self.samples += [min(samples), statistics.median(samples), max(samples)]

    def row(self, flops, ceiling_tflops, check):
        ms = statistics.median(self.medians)
        tf = tflops(flops, ms)
        torch = self.torch
        return {"rung": "cudnn", "executor": "torch.nn", "ms_median": ms,
                "ms_min": min(self.samples), "ms_max": max(self.samples),
                "runs": self.cfg.repeats * len(self.medians),
                "ms_median_per_timing": self.medians, "tflops": tf,
                "speedup_vs_naive": None, "ratio_vs_cudnn": 1.0,
                "share_of_ceiling": tf / ceiling_tflops, "check": check.as_dict(),
                "torch": torch.__version__, "cudnn_version": torch.backends.cudnn.version(),
                "tf32": self.dtype == "tf32", "dtype": self.dtype}

    def close(self):
        del self.module, self.x, self.hx, self.dy
        self.torch.cuda.empty_cache()


# torch's dtype of the module and inputs at each precision (tf32: fp32 tensors, TF32 on)
TORCH_DTYPES = {"float32": lambda t: t.float32, "tf32": lambda t: t.float32,
                "bfloat16": lambda t: t.bfloat16, "float16": lambda t: t.float16}


def torch_module(torch, model, dtype: str = "float32", device: str = "cuda"):
    """torch.nn's module of the rnnrt ``model`` (its cell, sizes and bias) holding its weights
    (its torch-compatible state_dict), on ``device`` in precision ``dtype``'s torch dtype
    (TORCH_DTYPES). On 'cuda' torch's TF32 flags are set for ``dtype`` (on for tf32, off
    otherwise: module docstring); the CPU has no TF32 (tf32 runs fp32 there)."""
    if device == "cuda":
        tf32 = dtype == "tf32"
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
    cell = model.cell_name
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(cell)
    kw = dict(num_layers=model.num_layers, bias=model.bias)
    if cls is None:
        cls = torch.nn.RNN
        kw["nonlinearity"] = cell.split("_")[1]
    m = cls(model.input_size, model.hidden_size, **kw)
    m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                       for k, v in model.state_dict().items()})
    m = m.to(device=device, dtype=TORCH_DTYPES[dtype](torch))
    # cuDNN's weights as one contiguous buffer (torch warns and compacts them at every call
    # otherwise: a copy of all weights a call added to cuDNN's time; no-op off cuDNN)
    m.flatten_parameters()
    return m


def cudnn_missing(cfg, cuda: bool = True) -> str | None:
    """Why cuDNN (torch.nn; ``cuda=False``: torch.nn on the CPU in its role) does not run for
    ``cfg`` (disabled, no torch, a torch without CUDA), or None where it does."""
    if not cfg.cudnn:
        return "disabled (--no-cudnn)"
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch not importable ({e})"
    if cuda and not torch.cuda.is_available():
        return "torch has no CUDA"
    return None


def float32_outputs(cfg, model, x, h0, c0, dy) -> dict:
    """cuDNN's outputs (CudnnBench.outputs: {'y'} + {'dx', 'grads'} with cfg.backward) of
    ``model`` on x [T, B, I], h0 [L, B, H], c0 [L, B, H] or None, dy [T, B, H] at float32 with
    TF32 off, whatever cfg.dtype: the high-precision reference of a tf32 or 16-bit ladder too
    large for the float64 one (bench/second_opinion.py). The module and its tensors are freed
    before this returns (the largest ladders, L4 H2048 B256 fwd+bwd, need the room for their
    rungs), and torch's TF32 flags are put back (a tf32 CudnnBench built before runs on them)."""
    import torch
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    bench = CudnnBench(cfg, model, x, h0, c0, dy, dtype="float32")
    try:
        return bench.outputs()
    finally:
        bench.close()
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def cudnn_bench(cfg, model, x, h0, c0, dy):
    """CudnnBench, or the reason there is none (a string: ``cudnn_missing``)."""
    return cudnn_missing(cfg) or CudnnBench(cfg, model, x, h0, c0, dy)
