"""`rnnrt sweep` (rnnrt/cli.py's command): its flags, the grid they name (bench/sweep.py's
SweepConfig), and the run: one process, or one a GPU with --gpus (bench/shards.py), then the
verdict of the files against cuDNN."""
from __future__ import annotations

from .cli_args import (UsageError, add_dtype, cell_flag, input_batch_flag, list_of, nonneg,
                       path_flag, positive, require_gpu, seconds_flag, shard_flag)


def sweep_parser(sub):
    from .bench import sweep as sw
    from .plan.switches import DEFAULT_INPUT_BATCH
    p = sub.add_parser(
        "sweep", help="the ladder (verified, then timed, beside cuDNN) at every point of a "
        "grid of sizes; JSON lines appended as each point finishes; resumable")
    p.add_argument("--hidden", type=list_of(positive, "positive ints"), default=None,
                   help="hidden sizes, e.g. 128,256 (default "
                        f"{','.join(map(str, sw.DEFAULT_HIDDEN))})")
    p.add_argument("--batch", type=list_of(positive, "positive ints"), default=None,
                   help=f"minibatches (default {','.join(map(str, sw.DEFAULT_BATCH))})")
    p.add_argument("--layers", type=list_of(positive, "positive ints"), default=None,
                   help=f"layer counts (default {','.join(map(str, sw.DEFAULT_LAYERS))})")
    p.add_argument("--cell", type=list_of(cell_flag, "cells"), default=None,
                   help="cells, e.g. lstm,gru (default lstm)")
    p.add_argument("--steps", type=positive, default=None,
                   help=f"timesteps at every point (default {sw.DEFAULT_STEPS}, "
                        f"{sw.SHORT_STEPS} for hidden >= {sw.LONG_STEPS_HIDDEN})")
    p.add_argument("--input-size", type=positive, default=None, help="default = hidden")
    p.add_argument("--input-batch", type=list_of(input_batch_flag, "ints or 'all'"),
                   default=None, help="k of the input-batching rung, a list sweeps it "
                   f"(default {DEFAULT_INPUT_BATCH})")
    p.add_argument("--executor", choices=["graph", "eager", "both"], default=None,
                   help="default graph (eager is host-bound: slow, and not what the rungs "
                        "can do); not with --cpu")
    p.add_argument("--repeats", type=positive, default=None, help="timed runs per rung "
                   "(median taken; default 10, --quick 5)")
    p.add_argument("--warmup", type=nonneg, default=None, help="untimed runs first (default 2)")
    p.add_argument("--quick", action="store_true",
                   help="a small preset: hidden 256,512,1024 x minibatch 32,64 x layers 1,4, "
                        "LSTM, 5 repeats (a few minutes on an H100); flags given win")
    p.add_argument("--preset", choices=sorted(sw.PRESETS), default=None,
                   help="a named grid: 'wide' = lstm,gru x layers 1,4 x hidden 128-2048 x "
                        "minibatch 8-256 x fwd and fwd+bwd, 100 steps, the auto row and cuDNN "
                        "timed in turn (where rnnrt is judged against cuDNN); flags given win")
    p.add_argument("--rungs", type=list_of(str, "rung names"), default=None,
                   help="rows to run at each point: rungs of the ladder and/or 'auto' (the "
                        "schedule selector's choice); default all of them")
    p.add_argument("--pass", dest="passes", type=list_of(str, "passes"), default=None,
                   help="fwd, fwd+bwd or both (fwd,fwd+bwd); default fwd (--backward: "
                        "fwd+bwd)")
    p.add_argument("--no-cudnn", action="store_true", help="skip the cuDNN rows")
    p.add_argument("--backward", action="store_true",
                   help="time forward+backward at every point (as `rnnrt ladder --backward`;"
                        " pass 'fwd+bwd', FLOPs 3x the forward's)")
    p.add_argument("--out", type=path_flag, default=None,
                   help="JSON-lines results file (default: a new <out>/results/sweep/"
                        "sweep[-quick][-bwd]-<cells>-<device>-<stamp>.jsonl; with --resume the "
                        "newest such file)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue the file: skip the points it already has")
    g.add_argument("--overwrite", action="store_true", help="start the file again")
    p.add_argument("--retry-errors", action="store_true",
                   help="with --resume: run again the points that raised")
    p.add_argument("--retry-refused", action="store_true",
                   help="with --resume: run again the points whose last run has a refused "
                        "row (after the check or the kernels changed)")
    p.add_argument("--processes", type=positive, default=None,
                   help="run each point's ladder in this many fresh processes and pool them "
                        "(`rnnrt ladder --processes`: medians, each ratio within its process)")
    p.add_argument("--gpus", type=list_of(nonneg, "GPU indices"), default=None,
                   help="run on these GPUs of this host at once, e.g. 0,1: one process a GPU "
                        "(only it visible), each a share of the grid (--shard k/N) in a file "
                        "of its own (-shardKofN); their lines prefixed [gpu G]; --resume with "
                        "the same list")
    p.add_argument("--shard", type=shard_flag, default=None, metavar="K/N",
                   help="only the K-th of N shares of the grid: every N-th point, cheapest "
                        "first, from the K-th (what --gpus gives each GPU)")
    p.add_argument("--time-budget", type=seconds_flag, default=None, metavar="SECONDS",
                   help="stop cleanly before a point that would not finish within SECONDS "
                        "of the start (estimated from finished points); resume later")
    p.add_argument("--dry-run", action="store_true",
                   help="list the points (and which are done) and exit")
    p.add_argument("--verbose", action="store_true", help="print every rung's line")
    p.add_argument("--cpu", action="store_true",
                   help="no GPU: the NumPy executor at tiny sizes (default grid "
                        f"{sw.CPU_GRID}); figures are labelled CPU figures")
    add_dtype(p, "every point")
    return p


def sweep_config(a):
    from .bench import sweep as sw
    if a.cpu and a.executor is not None:
        raise UsageError(f"--executor {a.executor}: with --cpu the NumPy executor runs; drop "
                         f"--executor or --cpu")
    if a.quick and a.preset not in (None, "quick"):
        raise UsageError(f"--quick and --preset {a.preset} name two grids; pick one")
    if a.backward and a.passes is not None and "fwd+bwd" not in a.passes:
        raise UsageError(f"--backward and --pass {','.join(a.passes)} contradict each other; "
                         f"use --pass fwd+bwd (or drop --backward)")
    for flag in ("retry_errors", "retry_refused"):
        if getattr(a, flag) and not a.resume:
            raise UsageError(f"--{flag.replace('_', '-')} goes with --resume")
    if a.gpus is not None:
        if len(set(a.gpus)) != len(a.gpus):
            raise UsageError(f"--gpus {','.join(map(str, a.gpus))}: a GPU named twice")
        why = {"--shard": "--gpus gives each GPU its share; run one share with --shard K/N "
                          "alone",
               "--out": "each GPU writes a file of its own (the default name with "
                        "-shardKofN)",
               "--dry-run": "list one share's points with --shard K/N --dry-run"}
        for flag, given in (("--shard", a.shard), ("--out", a.out), ("--dry-run", a.dry_run)):
            if given:
                raise UsageError(f"--gpus and {flag}: {why[flag]}")
    kw = {}
    if a.preset:
        kw.update(sw.PRESETS[a.preset])
    if a.cpu:
        kw.update(sw.CPU_QUICK if a.quick else sw.CPU_GRID)
    elif a.quick:
        kw.update(sw.QUICK)
    for name, attr in (("hidden", "hidden"), ("batch", "batch"), ("layers", "layers"),
                       ("cells", "cell"), ("steps", "steps"), ("input_size", "input_size"),
                       ("input_batch", "input_batch"), ("repeats", "repeats"),
                       ("warmup", "warmup"), ("time_budget", "time_budget"),
                       ("rungs", "rungs"), ("passes", "passes"), ("processes", "processes"),
                       ("shard", "shard")):
        if getattr(a, attr) is not None:
            kw[name] = getattr(a, attr)
    executor = a.executor or "graph"
    kw["executors"] = ("eager", "graph") if executor == "both" else (executor,)
    try:
        return sw.SweepConfig(cudnn=not a.no_cudnn, cpu=a.cpu, retry_errors=a.retry_errors,
                              retry_refused=a.retry_refused, verbose=a.verbose,
                              backward=a.backward, dtype=a.dtype, **kw)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


def cmd_sweep(a) -> int:
    from pathlib import Path

    from .bench import sweep as sw
    from .bench.outputs import check_file
    cfg = sweep_config(a)
    if a.gpus is not None:
        return _sweep_on_gpus(a, cfg)
    created = None   # a new default file's stamp is its session line's 'created'
    if a.out is not None:
        path = Path(a.out)
    else:
        device = _sweep_device(a)
        latest = sw.latest_path(cfg, device, a.quick, preset=a.preset)
        if (a.resume or a.dry_run) and latest:
            path = latest
        else:
            from .bench.records import now_iso
            created = now_iso()
            path = sw.default_path(cfg, device, a.quick, preset=a.preset, created=created)
    if a.dry_run:
        done = (sw.done_keys(sw.read_lines(path), cfg.retry_errors, cfg.retry_refused)
                if path.is_file() else set())
        pts = sw.grid(cfg)
        for p in pts:
            print(f"{'done' if p.key() in done else 'todo'}  {p.label():40s} "
                  f"{p.flops:.3g} FLOPs")
        print(f"{len(pts)} points, {sum(p.key() in done for p in pts)} done in {path}")
        return 0
    if path.is_file() and path.stat().st_size > 0 and not (a.resume or a.overwrite):
        raise UsageError(f"--out: {path} already has results; pass --resume to continue it "
                         f"(skipping the points it has) or --overwrite to start again")
    check_file(path, "--out", overwrite=a.overwrite, existing_ok=a.resume)
    require_gpu("sweep", a.cpu)
    _check_sweep_sizes(cfg)
    res = sw.run_sweep(cfg, path, resume=a.resume, overwrite=a.overwrite, created=created)
    print(f"{res.path}: {res.done} points done, {res.errors} raised, {res.skipped} were "
          f"already there, {res.remaining} left, of {res.total} ({res.seconds:.0f} s)")
    if res.stopped:
        print(f"stopped early: {res.stopped}\n  continue with the same command and --resume")
    print(f"figures: rnnrt plot {res.path}")
    _print_verdict([res.path])
    if res.stopped == "interrupted":
        return 130
    return 1 if res.errors else 0


def _sweep_device(a) -> str:
    """The device name a sweep's default files carry (the CPU's under --cpu)."""
    from .bench import sweep as sw
    from .device import gpu_status
    return sw.cpu_device_name() if a.cpu else gpu_status()[1]


def _check_sweep_sizes(cfg) -> None:
    """Every point's sizes (SizeError naming the first that does not fit), before any runs."""
    from .bench import sweep as sw
    from .bench.ladder import check_sizes
    for point in sw.grid(cfg):
        check_sizes(point.ladder_config(cfg))


def _print_verdict(paths) -> None:
    """The verdict of sweep files (their auto rows vs cuDNN), nothing where they have none."""
    from .bench.plots import load_rows
    from .bench.summary import summarize
    for g in summarize(load_rows(list(paths), note=lambda m: None)):
        print("\n".join(g.text(limit=10)))


def _sweep_on_gpus(a, cfg) -> int:
    """`rnnrt sweep --gpus`: the shares on their GPUs at once (bench/shards.py), then the
    verdict of their files together."""
    import dataclasses

    from .bench import shards
    from .bench import sweep as sw
    if not a.cpu:
        require_gpu("sweep", a.cpu)
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
        bad = [g for g in a.gpus if g >= count]
        if bad:
            raise UsageError(f"--gpus: this process sees {count} GPU(s) (0-{count - 1}), "
                             f"not {','.join(map(str, bad))}")
    device = _sweep_device(a)
    try:
        for g in a.gpus:
            shards.visible_device(g)      # each one's CUDA_VISIBLE_DEVICES, before any work
    except ValueError as e:
        raise UsageError(str(e)) from None
    _check_sweep_sizes(cfg)               # one error here, not one a child
    codes = shards.run_shards(a.argv, a.gpus)
    n = len(a.gpus)
    files = [sw.latest_path(dataclasses.replace(cfg, shard=(k, n)), device, a.quick,
                            preset=a.preset) for k in range(1, n + 1)]
    files = [f for f in files if f is not None]
    print(f"{len(files)} shard file(s): " + " ".join(str(f) for f in files))
    _print_verdict(files)
    if 130 in codes:
        return 130
    return max(codes, default=0)
