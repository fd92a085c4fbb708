"""rnnrt.nn: drop-ins for torch.nn.LSTM, torch.nn.GRU and torch.nn.RNN.

    import rnnrt.nn
    lstm = rnnrt.nn.LSTM(input_size, hidden_size, num_layers=2, batch_first=True)
    output, (h_n, c_n) = lstm(x, (h0, c0))       # exactly as torch.nn.LSTM

torch.nn's constructor arguments, parameter names and initialisation (load_state_dict works
both ways), forward signature and return, PackedSequence in and out, bidirectional layers and
inter-layer dropout; autograd through rnnrt's own backward. CPU tensors run on the NumPy
reference in float32 / float64 (``rnnrt.varlen``: a per-step active batch, so packed
sequences cost their real steps); CUDA tensors on rnnrt's GPU runner (``rnnrt.nn.cuda``:
packed batches of different lengths on variable-length plans, the parameters read in place
from the module's flat buffer) in float32. On either device bfloat16 / float16 run under
``torch.autocast`` and for ``.to(torch.bfloat16)`` / ``.half()`` modules, with fp32
accumulation and 16-bit storage (``rnnrt.nn.precision`` says what each means). An LSTM
with projections (proj_size > 0) runs torch's own LSTM (cuDNN on CUDA), as torch.nn's: rnnrt
has no projection kernels, and the module says so (a warning, ``implementation``).

This is the only part of rnnrt that needs PyTorch; ``import rnnrt`` works without it.
Modules: ``modules`` (the nn.Modules), ``inputs`` (argument checks, packed form),
``function`` (the autograd Function), ``backend`` (the seam and its CPU implementation),
``cuda`` (the seam on CUDA), ``precision`` (which precision a call runs in), ``flat`` (the
parameters' flat buffer on CUDA), ``packing`` (a checked pack_padded_sequence).
"""
try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "rnnrt.nn needs PyTorch, which is not installed; install it with "
        "`pip install torch` (the CPU build is enough: `pip install torch --index-url "
        "https://download.pytorch.org/whl/cpu`). The rest of rnnrt works without it.") from exc

from .backend import empty_cache  # noqa: E402
from .modules import GRU, LSTM, RNN, RNNBase  # noqa: E402
from .packing import pack_padded_sequence  # noqa: E402

__all__ = ["GRU", "LSTM", "RNN", "RNNBase", "empty_cache", "pack_padded_sequence"]
