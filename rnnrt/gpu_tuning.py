"""The schedule selector of a ``GpuRunner`` (gpu.py): its timer and how it is built.

``ScheduleTimer(runner)`` is the timer ``kernels.selector.Selector`` calls: it builds the
plans of a candidate schedule on the runner's device state, loads random inputs and times
forward (or forward + backward) with CUDA events. It holds the last candidate's workspace
between the selector's calls (its first timed run and its repeats), and ``release()`` frees
it: the runner calls it once tuning is over and when it drops or closes its states.
``runner_selector`` builds the runner's Selector with its disk cache and the driver's cap on
co-resident clusters.
"""
from __future__ import annotations

from .plan.forward import forward_plan


class ScheduleTimer:
    """The selector's timer of one runner: ``timer(sched, shape, repeats) -> [ms, ...]``.

    ``repeats`` timed runs (ms, CUDA events) of ``sched`` (a kernels.schedules.Schedule) on
    random inputs of ``shape`` (a kernels.selector.Shape; the first
    ``selector.tuning_steps(shape)`` steps), after one warm-up run when the candidate is new;
    forward, or forward + backward for a training shape. A variable-length shape is timed on
    one representative pattern (plan.packing.staircase; kernels/selector.py's Selector says
    why), its mask all ones. The workspace it times on has a gradient buffer of its own: the
    timed backward (accumulate=False) must not overwrite the caller's gradients (a sum over
    micro-batches, say). Nothing is cached beyond the one candidate it holds."""

    def __init__(self, runner):
        self.runner = runner
        self._held = None   # (RunState, [executors]) of the candidate being timed
        self._what = None   # (schedule name, shape key, steps) of what _held times

    @property
    def held(self) -> tuple | None:
        """What the timer holds a workspace of, between the selector's calls: (schedule
        name, shape key, steps), or None."""
        return self._what if self._held is not None else None

    def release(self) -> None:
        """Free the workspace of the candidate last timed (the next call builds its own)."""
        self._held = self._what = None

    def __call__(self, sched, shape, repeats: int) -> list:
        from .kernels.selector import tuning_steps
        from .plan.backward import backward_plan
        from .session import time_events
        r = self.runner
        steps = tuning_steps(shape)
        pattern = None
        if shape.varlen:   # one representative pattern of the key (selector.Selector says why)
            from .plan.packing import staircase
            pattern = staircase(steps, shape.batch)
            steps = len(pattern)
        key = r.new_key(steps, shape.batch, shape.train, sched.switches, sched.family,
                        sched.backward, pattern, clusters=sched.clusters,
                        gemm=sched.gemm)
        what = (sched.name, shape.key(), steps)
        if self._what != what:
            self.release()   # free the last candidate's workspace first
            st = r.build_state(key, None)
            cp = r.cp
            rng = cp.random.default_rng(0)
            arrays = {name: (cp.ones(b.shape, cp.float32) if name == "mask" else
                             rng.standard_normal(b.shape, dtype=cp.float32))
                      for name, b in st.ws.plan.inputs.items()}
            st.ws.load(**arrays)
            runs = [st.executor(forward_plan(key), "fwd")]
            if shape.train:
                runs.append(st.executor(backward_plan(key), ("bwd", False, True)))
            cp.cuda.Device().synchronize()
            self._held, self._what = (st, runs), what
            warm = 1
        else:
            warm = 0
        _, runs = self._held

        def run():
            for ex in runs:
                ex.run()

        return time_events(r.cp, run, runs[0].stream, repeats, warm)


def runner_selector(runner, schedule_cache, timer, log=None):
    """The kernels.selector.Selector of ``runner`` (a GpuRunner): timing through ``timer``
    (a ScheduleTimer, or any ``timer(sched, shape, repeats)``), on the runner's device
    limits, remembering choices in ``schedule_cache`` (a kernels.tuning.ScheduleCache; None:
    the default file for this device and version; False: memory only), the cluster counts
    it times capped by the driver's count of co-resident clusters of the compiled kernel
    (kernels/occupancy.py; the rule's cap, saying why, where the driver cannot answer)."""
    from .kernels.occupancy import cluster_cap
    from .kernels.selector import Selector
    from .kernels.tuning import ScheduleCache, device_key
    cache = schedule_cache
    if cache is None:
        from . import __version__
        cache = ScheduleCache(device_key({**runner.session.info, "rnnrt": __version__}))
    elif cache is False:   # memory only (not `or None`: an empty cache is falsy)
        cache = None

    def cap(fit, dtype="float32"):
        # the kernel's instantiation at the key's precision (the mmac kernels have 16-bit
        # ones only)
        lib = runner.session.ctx.kernels
        return cluster_cap(fit, runner.limits.props(),
                           lib.with_shared(fit.kernel, fit.smem_bytes, dtype))

    return Selector(timer, runner.limits, cache, log=log, cluster_cap=cap)
