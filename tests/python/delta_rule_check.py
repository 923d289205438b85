"""Reference side of tests/tests/delta_rule_reference.rs: transformers' own Gated DeltaNet
functions (models/qwen3_5/modeling_qwen3_5.py) on the inputs the Rust side drew, with gradients
by torch autograd, so that our kernels are held to transformers' orientation, eps and scaling.

  delta_rule_check.py IN.json OUT.json

IN.json holds one entry per check, each a mapping of tensors {"shape": [...], "values": [...]}
(float32) and plain numbers. OUT.json: {check: {name: tensor}}, every tensor float32.

  delta_chunk, delta_recurrent   torch_chunk_gated_delta_rule (chunk_size 64) and
        torch_recurrent_gated_delta_rule with use_qk_l2norm_in_kernel=True on raw q, k (repeated
        to the value heads as Qwen3_5GatedDeltaNet does), v, beta, g and an initial state; the
        output, the final state, and the gradients of sum(out*dout) + sum(state*dstate) for q, k,
        v, beta, g and the initial state
  delta_packed_chunk, delta_packed_recurrent   each document of a packed row run alone from a
        zero state, the outputs concatenated: output, the last document's state, gradients
  conv            causal_conv1d_fn(activation="silu") with a bias: y and the gradients of x, w, bias
  conv_packed     causal_conv1d_fn on each document alone, concatenated: y, dx, dw
  conv_decode     causal_conv1d_update one token at a time from a [B, C, W-1] state: y, the state
  gated_norm      Qwen3_5RMSNormGated(eps) with a given weight: y and the gradients of x, z, weight
  layer           a whole Qwen3_5GatedDeltaNet (no cache, no mask) with the given parameters: its
                  output and the gradients of the hidden states and of every parameter (the gates
                  beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) are computed inline
                  there, so this is where ours meet transformers')
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig  # noqa: E402
from transformers.models.qwen3_5.modeling_qwen3_5 import (  # noqa: E402
    Qwen3_5GatedDeltaNet,
    Qwen3_5RMSNormGated,
    causal_conv1d_fn,
    causal_conv1d_update,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)


def tensor(d: dict, grad: bool = False) -> torch.Tensor:
    t = torch.tensor(d["values"], dtype=torch.float32).reshape(d["shape"])
    return t.requires_grad_(grad)


def out(t: torch.Tensor) -> dict:
    t = t.detach().to(torch.float32).contiguous()
    return {"shape": list(t.shape), "values": t.flatten().tolist()}


DELTA = ("q", "k", "v", "beta", "g")


def delta_call(rule, x: dict, initial):
    """The rule as Qwen3_5GatedDeltaNet calls it: q, k repeated to the value heads."""
    rep = x["v"].shape[2] // x["q"].shape[2]
    q, k = (x[n].repeat_interleave(rep, dim=2) for n in ("q", "k"))
    return rule(q, k, x["v"], g=x["g"], beta=x["beta"], initial_state=initial, output_final_state=True,
                use_qk_l2norm_in_kernel=True)


def delta(case: dict, rule) -> dict:
    x = {n: tensor(case[n], grad=True) for n in DELTA}
    s0 = tensor(case["s0"], grad=True)
    o, s = delta_call(rule, x, s0)
    ((o * tensor(case["dout"])).sum() + (s * tensor(case["dstate"])).sum()).backward()
    return {"out": out(o), "state": out(s), "dstate": out(s0.grad), **{"d" + n: out(x[n].grad) for n in DELTA}}


def delta_packed(case: dict, rule) -> dict:
    x = {n: tensor(case[n], grad=True) for n in DELTA}
    outs, start, s = [], 0, None
    for n in case["lens"]:
        doc = {name: t[:, start:start + n] for name, t in x.items()}
        o, s = delta_call(rule, doc, None)
        outs.append(o)
        start += n
    o = torch.cat(outs, dim=1)
    (o * tensor(case["dout"])).sum().backward()
    return {"out": out(o), "state": out(s), **{"d" + n: out(x[n].grad) for n in DELTA}}


def conv_fn(x: torch.Tensor, w: torch.Tensor, bias) -> torch.Tensor:
    """Our [B, T, C] layout through transformers' [B, C, T] function."""
    return causal_conv1d_fn(x.transpose(1, 2), w, bias, activation="silu").transpose(1, 2)


def conv(case: dict) -> dict:
    x, w, bias = (tensor(case[n], grad=True) for n in ("x", "w", "bias"))
    y = conv_fn(x, w, bias)
    (y * tensor(case["dy"])).sum().backward()
    return {"y": out(y), "dx": out(x.grad), "dw": out(w.grad), "dbias": out(bias.grad)}


def conv_packed(case: dict) -> dict:
    x, w = tensor(case["x"], grad=True), tensor(case["w"], grad=True)
    ys, start = [], 0
    for n in case["lens"]:
        ys.append(conv_fn(x[:, start:start + n], w, None))
        start += n
    y = torch.cat(ys, dim=1)
    (y * tensor(case["dy"])).sum().backward()
    return {"y": out(y), "dx": out(x.grad), "dw": out(w.grad)}


def conv_decode(case: dict) -> dict:
    x, w, bias, state = (tensor(case[n]) for n in ("x", "w", "bias", "s0"))
    ys = []
    for t in range(x.shape[1]):
        # updates `state` in place, as the cache's conv state
        y = causal_conv1d_update(x[:, t:t + 1].transpose(1, 2), state, w, bias, "silu")
        ys.append(y.transpose(1, 2))
    return {"y": out(torch.cat(ys, dim=1)), "state": out(state)}


def gated_norm(case: dict) -> dict:
    x, z = tensor(case["x"], grad=True), tensor(case["z"], grad=True)
    norm = Qwen3_5RMSNormGated(x.shape[-1], eps=case["eps"])
    with torch.no_grad():
        norm.weight.copy_(tensor(case["w"]))
    y = norm(x, z)
    (y * tensor(case["dy"])).sum().backward()
    return {"y": out(y), "dx": out(x.grad), "dz": out(z.grad), "dw": out(norm.weight.grad)}


# Our name of each of the layer's parameters (its shape in the case), and transformers'.
LAYER_PARAMS = {
    "dt_bias": "dt_bias",
    "A_log": "A_log",
    "conv": "conv1d.weight",
    "norm": "norm.weight",
    "in_proj_qkv": "in_proj_qkv.weight",
    "in_proj_z": "in_proj_z.weight",
    "in_proj_b": "in_proj_b.weight",
    "in_proj_a": "in_proj_a.weight",
    "out_proj": "out_proj.weight",
}


def layer(case: dict) -> dict:
    hk, h, dk, dv, width = (case[n] for n in ("hk", "h", "dk", "dv", "width"))
    x = tensor(case["hidden"], grad=True)
    config = Qwen3_5TextConfig(
        hidden_size=x.shape[-1], linear_num_key_heads=hk, linear_num_value_heads=h, linear_key_head_dim=dk,
        linear_value_head_dim=dv, linear_conv_kernel_dim=width, rms_norm_eps=case["eps"], hidden_act="silu",
        num_hidden_layers=1, layer_types=["linear_attention"],
    )
    module = Qwen3_5GatedDeltaNet(config, layer_idx=0)
    params = {ours: module.get_parameter(theirs) for ours, theirs in LAYER_PARAMS.items()}
    with torch.no_grad():
        for ours, p in params.items():
            p.copy_(tensor(case[ours]).reshape(p.shape))
    y = module(x)
    (y * tensor(case["dout"])).sum().backward()
    grads = {"d" + ours: out(p.grad.reshape(case[ours]["shape"])) for ours, p in params.items()}
    return {"out": out(y), "dhidden": out(x.grad), **grads}


def main() -> None:
    cases = json.load(open(sys.argv[1]))
    results = {
        "delta_chunk": delta(cases["delta"], torch_chunk_gated_delta_rule),
        "delta_recurrent": delta(cases["delta"], torch_recurrent_gated_delta_rule),
        "delta_packed_chunk": delta_packed(cases["delta_packed"], torch_chunk_gated_delta_rule),
        "delta_packed_recurrent": delta_packed(cases["delta_packed"], torch_recurrent_gated_delta_rule),
        "conv": conv(cases["conv"]),
        "conv_packed": conv_packed(cases["conv_packed"]),
        "conv_decode": conv_decode(cases["conv_decode"]),
        "gated_norm": gated_norm(cases["gated_norm"]),
        "layer": layer(cases["layer"]),
    }
    json.dump(results, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
