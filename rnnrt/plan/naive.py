"""The naive rung's pointwise work: one kernel per elementary operation (ew_add, ew_sigmoid,
ew_mul, ...), forward and backward, in the order the fused kernels compute -- the paper's
starting point, which the fused switch replaces by one kernel a step (cuda_src/lstm.cu,
gru.cu, rnn.cu). Each function takes the plan builder ``b`` (forward.ForwardBuilder or
backward.BackwardBuilder: its views, buffers and cell) and the step's views; it returns ops.
Its temporaries: pre{l} [B, G*H] and tmp{l} [2, B, H] (forward), dtmp{l} [4, B, H]
(backward), which the builders allocate when the fused switch is off.
"""
from __future__ import annotations

from .ops import Kernel, View


def forward_ops(b, layer, t, s, gx, gh, bw, br, hprev, hnew, act, meta):
    """Step t of layer ``layer`` (stream s): gx, gh [B, G*H], the bias views bw, br, hprev /
    hnew [B, H] and act [B, saved_gates*H] (or None) -> the ops, one an operation."""
    B, H, GH = b.bs[t], b.H, b.GH
    pre = View(f"pre{layer}", 0, B, GH, GH)

    def col(v, q, width=H):   # gate block q of a [B, *] view
        return View(v.buf, v.offset + q * H, v.rows, width, v.ld)

    tmp0 = View(f"tmp{layer}", 0, B, H, H)
    tmp1 = View(f"tmp{layer}", B * H, B, H, H)

    def k(name, out, *ins):
        return Kernel(s, name, B, out.cols, (out,), tuple(ins), **meta)

    name = b.cell.name
    if name == "lstm":
        i, f, g, o = (col(act, q) for q in range(4))
        cprev, cnew = b.c(layer, t, B), b.c(layer, t + 1)
        return [
            k("ew_add", pre, gx, bw), k("ew_add", pre, pre, gh), k("ew_add", pre, pre, br),
            k("ew_sigmoid", i, col(pre, 0)), k("ew_sigmoid", f, col(pre, 1)),
            k("ew_tanh", g, col(pre, 2)), k("ew_sigmoid", o, col(pre, 3)),
            k("ew_mul", tmp0, f, cprev), k("ew_mul", tmp1, i, g),
            k("ew_add", cnew, tmp0, tmp1), k("ew_tanh", tmp0, cnew),
            k("ew_mul", hnew, o, tmp0),
        ]
    if name == "gru":
        rz = col(pre, 0, 2 * H)
        r, z, n, hn = (col(act, q) for q in range(4))
        return [
            k("ew_add", pre, gx, bw),                       # gx + b_i (all three gates)
            k("ew_add", hn, col(gh, 2), col(br, 2)),        # hn = W_hn h + b_hn (saved)
            k("ew_add", rz, rz, col(gh, 0, 2 * H)),
            k("ew_add", rz, rz, col(br, 0, 2 * H)),
            k("ew_sigmoid", r, col(pre, 0)), k("ew_sigmoid", z, col(pre, 1)),
            k("ew_mul", tmp0, r, hn), k("ew_add", tmp0, col(pre, 2), tmp0),
            k("ew_tanh", n, tmp0),
            k("ew_sub", tmp1, hprev, n), k("ew_mul", tmp1, z, tmp1),
            k("ew_add", hnew, n, tmp1),
        ]
    nonlin = "ew_tanh" if name == "rnn_tanh" else "ew_relu"
    return [k("ew_add", pre, gx, bw), k("ew_add", pre, pre, gh), k("ew_add", pre, pre, br),
            k(nonlin, hnew, pre)]


def backward_ops(b, layer, t, s, dhin, dhr_next, dgx, act, meta):
    """Step t's pointwise backward: dhin, dhr_next [B, H], dgx [B, G*H] (GRU: its dgh
    alongside), act [B, saved_gates*H] (or None) -> the ops, one an operation."""
    B, H = b.bs[t], b.H

    def col(v, q):
        return View(v.buf, v.offset + q * H, v.rows, H, v.ld)

    tmp = [View(f"dtmp{layer}", i * b.B * H, B, H, H) for i in range(4)]

    def k(name, out, *ins):
        return Kernel(s, name, B, H, (out,), tuple(ins), **meta)

    name = b.cell.name
    if name == "lstm":
        i, f, g, o = (col(act, q) for q in range(4))
        dh, tc, dcc, d = tmp
        return [
            k("ew_add", dh, dhin, dhr_next),
            k("ew_tanh", tc, b.c(layer, t + 1)),
            k("ew_mul", dcc, dh, o),
            k("ew_dtanh", dcc, dcc, tc),
            k("ew_add", dcc, b.slot("dc", layer, t + 1), dcc),
            k("ew_mul", d, dh, tc), k("ew_dsigmoid", col(dgx, 3), d, o),
            k("ew_mul", d, dcc, g), k("ew_dsigmoid", col(dgx, 0), d, i),
            k("ew_mul", d, dcc, b.c(layer, t, B)), k("ew_dsigmoid", col(dgx, 1), d, f),
            k("ew_mul", d, dcc, i), k("ew_dtanh", col(dgx, 2), d, g),
            k("ew_mul", b.slot("dc", layer, t, B), dcc, f),
        ]
    if name == "gru":
        r, z, n, hn = (col(act, q) for q in range(4))
        dgh = View(f"dgh{layer}", dgx.offset, dgx.rows, dgx.cols, dgx.ld)
        dh, dn, dz, dr = tmp
        dhz = b.slot("dhr", layer, t, B)
        # dn' = the n block's gate gradient: read back from dgx where that is exact
        # (fp32 storage: the fp32 plans' ops), else kept in dn (fp32) and stored once
        if b.key.precision.rounds:
            dnp = dn
            dn_ops = [k("ew_dtanh", dn, dn, n), k("ew_copy", col(dgx, 2), dn)]
        else:
            dnp = col(dgx, 2)
            dn_ops = [k("ew_dtanh", dnp, dn, n)]
        return [
            k("ew_add", dh, dhin, dhr_next),
            k("ew_mul", dhz, dh, z),
            k("ew_sub", dn, dh, dhz),
            *dn_ops,
            k("ew_mul", col(dgh, 2), dnp, r),
            k("ew_sub", dz, b.h(layer, t, B), n),
            k("ew_mul", dz, dh, dz),
            k("ew_dsigmoid", col(dgx, 1), dz, z), k("ew_dsigmoid", col(dgh, 1), dz, z),
            k("ew_mul", dr, dnp, hn),
            k("ew_dsigmoid", col(dgx, 0), dr, r), k("ew_dsigmoid", col(dgh, 0), dr, r),
        ]
    dnl = "ew_dtanh" if name == "rnn_tanh" else "ew_drelu"
    return [k("ew_add", tmp[0], dhin, dhr_next), k(dnl, dgx, tmp[0], b.h(layer, t + 1))]


def select_backward_ops(b, layer, t, s, dhr_next, dgx, meta):
    """The naive rung's frozen rows (variable-length plans): after the per-operation
    kernels, the gradients of a frozen row are replaced by what the masked fused
    kernels give it: dgx (and GRU's dgh) 0, dc_prev = dc_next, the direct part of
    dh_{t-1} = dh_rec; a running row keeps its own (direct part 0 but GRU's dh*z)."""
    B, H, GH, m = b.bs[t], b.H, b.GH, b.mask(t)
    zeros = View("zeros", 0, B, GH, 0)
    dh_prev = b.slot("dhr", layer, t, B)

    def sel(out, running, frozen):
        return Kernel(s, "ew_select", B, out.cols, (out,), (m, running, frozen), **meta)

    ops = [sel(dgx, dgx, zeros)]
    if b.gru:
        dgh = View(f"dgh{layer}", dgx.offset, B, GH, GH)
        ops += [sel(dgh, dgh, zeros), sel(dh_prev, dh_prev, dhr_next)]
    else:
        ops.append(sel(dh_prev, View("zeros", 0, B, H, 0), dhr_next))
    if b.cell.has_cell_state:
        dc = b.slot("dc", layer, t, B)
        ops.append(sel(dc, dc, b.slot("dc", layer, t + 1)))
    return ops
