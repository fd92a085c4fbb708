"""rnnrt: a performance-engineered runtime for stacked recurrent networks on NVIDIA GPUs.

CPU side (always importable, needs only NumPy): the models with PyTorch's parameter
conventions, the NumPy reference forward/backward, the switches and the plan builder.
GPU side (needs CuPy): ``rnnrt.gpu.GpuRunner`` — CuPy is imported only when it is used, so
``import rnnrt`` works on any machine.
"""
from .cells import CELLS, Cell, backward_flops, forward_flops, get_cell, tflops
from .device import GpuUnavailable, gpu_available
from .models import GRU, LSTM, RNN, Grads, Tape
from .plan.switches import ALL, Rung, Switches, ladder

__version__ = "0.28.0"

__all__ = ["ALL", "CELLS", "Cell", "GRU", "Grads", "GpuUnavailable", "LSTM", "RNN", "Rung",
           "Switches", "Tape", "backward_flops", "forward_flops", "get_cell", "gpu_available",
           "ladder", "tflops"]
