"""The kernels: what runs on the GPU for each op of a plan, and how it fits the device.

  registry.py    the one list of CUDA kernels: arguments, shapes, launch geometry, twins
  sources.py     cuda_src/ on disk: file text, the kernel headers
  library.py     compiling and launching them (CuPy; imported only when a kernel runs)
  twins.py       NumPy twins of the pointwise kernels (the CPU executor runs these)
  limits.py      DeviceLimits: the device properties a fit reads
  budget.py      what a persistent launch may use on a device (shared by the fits)
  persistent.py  the per-layer persistent kernels (grid, cluster): the fit
  emulate.py     their decomposition in NumPy, and their twins
  stack.py       the stack kernel (every layer in one launch): fit and twin
  choice.py      the one place that decides which kernel runs for a shape, and the
                 schedules a shape may run (candidates, heuristic)
  selector.py    the schedule selector: times the candidates once, remembers the fastest
  gemm_split.py  how the per-step backward splits its recurrent GEMM along K
"""
