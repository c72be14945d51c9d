"""The backward of one block-wise block, written out instead of recorded by autograd.

`BlockAttention` wraps one block of query rows (backends/blockwise.py) as an autograd Function. Its
forward runs the twin's formulas (`reference.ascender_rows`) without recording anything; its backward
runs them again without recording, keeping the block's [B, H, rows, n] intermediates, and applies
the derivatives of docs/backward.md to whole blocks: every pair product a matrix product, the
elementwise work in place where a tensor is not needed again. Against recording the recomputation
and letting autograd differentiate it (a `torch.utils.checkpoint` region, which the backend uses
under torch.compile and where this Function does not apply), this saves the recording and about
half the elementwise passes. The per-row factors' gradients (the lambdas, the gates, eta) take the
exact form of docs/backward.md, as the fused kernels do (autograd's literal sums cancel to about
eps / std of their terms). The paper variant's heading and gate, [B, H, rows, k, d]
tensors, are differentiated by autograd. Where the backward itself is differentiated
(create_graph=True), it records the recomputation and differentiates that, so double backward works.
"""

from __future__ import annotations

import torch

from .. import reference as formulas
from ..reference import rowdot
from .._spec import EPS_STD, EPS_TAU

_threshold_backward = torch.ops.aten.threshold_backward  # grad where x > 0, else 0: relu's backward


class BlockAttention(torch.autograd.Function):
    """apply(run, meta, q, k, v, z, k_hat, h_hat, z_own, k_hat_own, h_hat_own, *scalars) ->
    (y, [coh, sep], [u], nbr): run(*tensors, keep=None) evaluates the block (ascender_rows' dict);
    meta = dict(take=the block's keys (slice or LongTensor), o=the options, aux=coh and sep wanted,
    scalars=the names of the scalars: the nine learnable ones, then "sinks" where there are sinks)."""

    @staticmethod
    def forward(ctx, run, meta, *tensors):
        ctx.run, ctx.meta = run, meta
        ctx.save_for_backward(*tensors)
        r = run(*tensors)
        ctx.mark_non_differentiable(r["nbr"])
        return tuple(_outputs(meta, r)) + (r["nbr"],)

    @staticmethod
    def backward(ctx, *grads):
        tensors = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: differentiate the recorded recomputation
            return (None, None) + _recorded_backward(ctx, tensors, grads)
        return (None, None) + _block_backward(ctx.run, ctx.meta, tensors, grads, ctx.needs_input_grad[2:])


def _outputs(meta, r) -> list:
    """The differentiable outputs of the block dict r: y, [coh, sep], [u (paper)]."""
    outs = [r["y"]] + ([r["coh"], r["sep"]] if meta["aux"] else [])
    return outs + ([r["u"]] if meta["o"]["variant"] == "paper" else [])


def _recorded_backward(ctx, tensors, grads) -> tuple:
    wanted = [t for t, need in zip(tensors, ctx.needs_input_grad[2:]) if need]
    outs = _outputs(ctx.meta, ctx.run(*tensors))
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    found = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], create_graph=True,
                                     allow_unused=True) if pairs else [None] * len(wanted))
    return tuple(next(found) if need else None for need in ctx.needs_input_grad[2:])


def _scatter(g: torch.Tensor, like: torch.Tensor, take) -> torch.Tensor:
    """The gradient g of like[..., take, :] as a gradient of like."""
    out = torch.zeros_like(like)
    if isinstance(take, slice):
        out[..., take, :] = g
    else:
        out.index_add_(2, take, g)
    return out


def _head_sum(t: torch.Tensor) -> torch.Tensor:
    """A [B, H, b, *] sum as the [1, H, 1, 1] gradient of a per-head scalar."""
    return t.sum(dim=tuple(i for i in range(t.dim()) if i != 1), keepdim=True).reshape(1, -1, 1, 1)


def _block_backward(run, meta, tensors, grads, needs) -> tuple:
    o, take = meta["o"], meta["take"]
    paper = o["variant"] == "paper"
    q, k, v, z, k_hat, h_hat, z_own, k_hat_own, h_hat_own = tensors[:9]
    sc = dict(zip(meta["scalars"], tensors[9:]))
    keep = {}
    run(*tensors, keep=keep)
    kb, vb, zb, hkb, hhb = (x[..., take, :] for x in (k, v, z, k_hat, h_hat))
    A, Tf, n, S = keep["A"], keep["Tf"], keep["n"], keep["S"]
    grads = list(grads[:-1])  # (nbr has none)
    gy = grads.pop(0)
    gcoh, gsep = (grads.pop(0), grads.pop(0)) if meta["aux"] else (None, None)
    gu = grads.pop(0) if paper else None

    # upstream gradients of the rows that output something: not empty, not NaN (SPEC section 11)
    ok = keep["seen"] if keep["sick"] is None else keep["seen"] * (~keep["sick"]).unsqueeze(-1).to(q.dtype)
    gy = torch.zeros_like(keep["Av"]) if gy is None else gy * ok
    gcoh = None if gcoh is None else gcoh * ok[..., 0]
    gsep = None if gsep is None else gsep * ok[..., 0]

    # pass 1: softmax, the temperature, softcap, q.k and A.v (y = (A drop) v: the dropout factor, SPEC 9b)
    drop = keep["drop"]
    dA = gy @ vb.transpose(-2, -1)
    if drop is not None:
        dA.mul_(drop)
    P = (gy * keep["Av"]).sum(-1, keepdim=True)  # (dv wide)
    for g, m in ((gcoh, keep["rc"]), (gsep, keep["phi"])):
        if g is not None:
            dA.addcmul_(m, g.unsqueeze(-1))
            P += g.unsqueeze(-1) * rowdot(A, m)
    dS = dA.sub_(P).mul_(A)  # dx
    # the sink logit (docs/backward.md, attention sinks): dsink = -a_sink P per row, summed to the sinks' shape
    g_sink = (-keep["a_sink"] * P).sum_to_size(sc["sinks"].shape) if "sinks" in sc else None
    temp = sc["score_temp"] + EPS_TAU
    g_temp = _head_sum(-rowdot(dS, S)) / temp ** 2
    dS.div_(temp)
    if o["softcap"] is not None:  # capped = c tanh(S' / c): dS' = dS (1 - (capped / c)^2)
        dS.mul_(1.0 - (keep["capped"] / o["softcap"]).square_())
    dq = (dS @ kb) * o["scale"]
    dkb = (dS.transpose(-2, -1) @ q) * o["scale"]
    dvb = (A if drop is None else A * drop).transpose(-2, -1) @ gy

    # pass 2: the row normalizations, b~ = dev / (std + eps) with dev = (beta - mean) on T
    n_div = (n if paper else n - 1).clamp_min(1)
    dS_sum = dS.sum(-1, keepdim=True)
    dbeta, g_omega, factor = {}, {}, {}
    for X, (dev, std) in keep["scaled"].items():
        omega = sc["omega_" + X]
        inv = 1.0 / (std + EPS_STD)
        r = rowdot(dS, dev)  # dL/dinv / omega
        g_omega[X] = _head_sum(r * inv)
        # sum_T dbeta_j w_j for beta = theta w, theta a per-row factor: the literal sum cancels to about
        # eps / std of its terms; docs/backward.md's exact form, eps inv^2 omega sum_T dS (w - mean w),
        # is eps inv^2 omega r / theta (where theta = 0, the literal sum: exact() below)
        factor[X] = EPS_STD * inv * inv * omega * r
        # dL/ddev = omega inv dS + coef dev (the std's path, 0 at std = 0), then the mean's path
        coef = torch.where(std > 0, -(omega * r) * inv * inv / (n_div * std.clamp_min(torch.finfo(std.dtype).tiny)),
                           torch.zeros_like(std))
        mean = (omega * inv * dS_sum + coef * dev.sum(-1, keepdim=True)) / n.clamp_min(1)
        dbeta[X] = (dS * (omega * inv)).addcmul_(dev, coef).addcmul_(Tf, -mean)

    def exact(f, theta, literal):
        """sum_T dbeta_j w_j of beta = theta w, per row (above); literal() where theta = 0."""
        theta = theta.expand_as(f)
        zero = theta == 0
        if not formulas.eager_cpu(zero) or bool(zero.any()):  # (no host sync off the CPU)
            return torch.where(zero, literal(), f / torch.where(zero, torch.ones_like(theta), theta))
        return f / theta

    # alignment: beta_a = (lambda_a gate u) . k^_j
    lam_a, dba = sc["lambda_align"], dbeta["align"]
    Ga = dba @ hkb
    if paper:
        u, gate_a = keep["u"], keep["gate_a"]
        ug = exact(factor["align"], lam_a * gate_a, lambda: (u * Ga).sum(-1, keepdim=True))
        g_lam_a = _head_sum(gate_a * ug)
        dhkb = dba.transpose(-2, -1) @ (lam_a * gate_a * u)
        du = lam_a * gate_a * Ga + (0.0 if gu is None else gu)
        with torch.enable_grad():  # u and the gate from the neighbours' k^ ([B, H, b, k, d])
            leaf = hkb.detach().requires_grad_()
            heading = formulas.neighbour_heading(leaf, keep["order"], keep["valid"], o["alpha_align"])
            dhkb += torch.autograd.grad(heading, leaf, (du, lam_a * ug))[0]
        dhk_own = None
    else:
        ug = exact(factor["align"], lam_a, lambda: (k_hat_own * Ga).sum(-1, keepdim=True))
        g_lam_a = _head_sum(ug)
        dhkb = dba.transpose(-2, -1) @ (lam_a * k_hat_own)
        dhk_own = lam_a * Ga

    # separation: beta_s = -lambda_s eta phi, phi = ws relu(a - delta), eta = clamp(rho / kappa, 0, 1)
    lam_s, dbs, phi, eta, rho = sc["lambda_sep"], dbeta["sep"], keep["phi"], keep["eta"], keep["rho"]
    ts = exact(factor["sep"], -lam_s * eta, lambda: rowdot(dbs, phi))
    g_lam_s = _head_sum(-eta * ts)
    deta = -lam_s * ts
    dphi = dbs.mul_(-lam_s * eta)
    if gsep is not None:
        dphi.addcmul_(A, gsep.unsqueeze(-1))
    kappa = sc["kappa"] + EPS_TAU
    inside = ((rho / kappa >= 0) & (rho / kappa <= 1)).to(q.dtype)  # where the clamp passes gradient
    drho = deta * inside / kappa
    g_kappa = _head_sum(-deta * inside * rho / kappa ** 2)
    ws, near = keep["ws"], keep["near"]
    dws = (dphi * near).addcmul_(keep["dens"], drho)
    da = _threshold_backward(dphi.mul_(ws), near, 0)
    g_delta = _head_sum(-da.sum(-1))

    # cohesion: beta_c = -lambda_c gate rc / tau_c, rc = ||z_j - c||^2, c = sum_T wc z / (W + eps)
    lam_c, dbc, rc, wcT, c = sc["lambda_coh"], dbeta["coh"], keep["rc"], keep["wcT"], keep["c"]
    gate_c, tc = keep["gate_c"], o["tau_coh"] + EPS_TAU
    tcs = exact(factor["coh"], -lam_c * gate_c / tc, lambda: rowdot(dbc, rc))
    g_lam_c = _head_sum(-gate_c / tc * tcs)
    drc = dbc.mul_(-lam_c * gate_c / tc)
    if gcoh is not None:
        drc.addcmul_(A, gcoh.unsqueeze(-1))
    W = keep["wc_sum"] + EPS_TAU
    if paper:  # gate_c = sigmoid(alpha_c G), G = sum_T wc rc / W
        G = rowdot(wcT, rc) / W
        dG = (-lam_c / tc * tcs) * gate_c * (1.0 - gate_c) * o["alpha_coh"]
        drc.addcmul_(wcT, dG / W)
    drc = _threshold_backward(drc, rc, 0)  # rc = relu(||c||^2 + ||z_j||^2 - 2 c.z_j)
    dc = -2.0 * (drc @ zb) + 2.0 * c * drc.sum(-1, keepdim=True)
    dzb = -2.0 * (drc.transpose(-2, -1) @ c) + 2.0 * zb * drc.sum(-2).unsqueeze(-1)
    dP = dc / W
    dW = -(dc * c).sum(-1, keepdim=True) / W
    if paper:
        dW = dW - dG * G / W
    dzb += wcT.transpose(-2, -1) @ dP
    dwc = (dP @ zb.transpose(-2, -1)).add_(dW)
    if paper:
        dwc.addcmul_(rc, dG / W)
    dwc.mul_(Tf)

    # kernel weights and distances: ws = exp(-D / ts), wc = exp(-D / tc), D = relu(||z_i||^2 + ||z_j||^2 - 2 z_i.z_j)
    tsep = o["tau_sep"] + EPS_TAU
    if keep["wc"] is ws:  # dD = -(dws ws / ts + dwc wc / tc), its factor -1 / ts applied to the products
        dD = dws.add_(dwc).mul_(ws)
    else:
        dD = dws.mul_(ws).addcmul_(dwc, keep["wc"], value=tsep / tc)
    dD = _threshold_backward(dD, keep["D"], 0)
    dz_own = (-2.0 * (dD @ zb) + 2.0 * z_own * dD.sum(-1, keepdim=True)) * (-1.0 / tsep)
    dzb += (-2.0 * (dD.transpose(-2, -1) @ z_own) + 2.0 * zb * dD.sum(-2).unsqueeze(-1)) * (-1.0 / tsep)
    dhh_own = da @ hhb
    dhhb = da.transpose(-2, -1) @ h_hat_own

    g_scalars = dict(lambda_align=g_lam_a, lambda_sep=g_lam_s, lambda_coh=g_lam_c, score_temp=g_temp,
                     delta=g_delta, kappa=g_kappa, sinks=g_sink, **{"omega_" + X: g for X, g in g_omega.items()})
    found = [dq, _scatter(dkb, k, take), _scatter(dvb, v, take), _scatter(dzb, z, take), _scatter(dhkb, k_hat, take),
             _scatter(dhhb, h_hat, take), dz_own, dhk_own, dhh_own] + [g_scalars[name] for name in meta["scalars"]]
    return tuple(g if need else None for g, need in zip(found, needs))
