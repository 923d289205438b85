"""Reference side of tests/tests/interop_optimizers.rs: the PyTorch-ecosystem optimizers that
mindxtrain's `train.optimizer.name` carries out, stepped on given float32 tensors.

Run with the venv of scripts/setup-torch:

  optimizers.py  IN.json  OUT.json

IN.json: {"params": {name: {"shape": [...], "values": [...]}},
          "steps": [{"lr": LR, "grads": {name: [...]}}, ...],
          "optimizers": [{"name": "sgd", "momentum": M, "weight_decay": W},
                         {"name": "lion", "betas": [B1, B2], "weight_decay": W},
                         {"name": "adafactor", "beta1": B1 or null, "eps": E, "weight_decay": W}, ...]}

For each optimizer, from the same parameters, every step sets each parameter's gradient and the
learning rate (as a scheduler does) and steps once. As HF Trainer groups them, parameters of rank
>= 2 get the weight decay and the others none. OUT.json: [{name: [values...]}, ...], the
parameters after the last step, one mapping per optimizer in the order given.

  sgd        torch.optim.SGD(lr, momentum, dampening=0, nesterov=False, weight_decay)
  adafactor  transformers.optimization.Adafactor(lr, eps=(eps, 1e-3), clip_threshold=1.0,
             decay_rate=-0.8, beta1, weight_decay, scale_parameter=False, relative_step=False,
             warmup_init=False)
  lion       lion-pytorch's update (Chen et al. 2023), written out below on torch tensors
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch.optim import Optimizer  # noqa: E402


class Lion(Optimizer):
    """lion-pytorch's Lion (github.com/lucidrains/lion-pytorch), not a dependency of the venv:
    decoupled weight decay, the sign of the interpolated momentum, then the momentum update."""

    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.data.mul_(1.0 - lr * wd)
                update = exp_avg.clone().mul_(beta1).add(grad, alpha=1.0 - beta1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(beta2).add_(grad, alpha=1.0 - beta2)


def groups(params: dict[str, torch.Tensor], weight_decay: float) -> list[dict]:
    """HF Trainer's split: decay for matrices (and higher ranks), none for vectors."""
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build(spec: dict, params: dict[str, torch.Tensor]) -> Optimizer:
    g = groups(params, spec["weight_decay"])
    if spec["name"] == "sgd":
        return torch.optim.SGD(g, lr=0.0, momentum=spec["momentum"], dampening=0.0, nesterov=False)
    if spec["name"] == "lion":
        return Lion(g, lr=0.0, betas=tuple(spec["betas"]), weight_decay=0.0)
    if spec["name"] == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            g,
            lr=1.0,  # set per step below; Adafactor refuses lr=0 without relative_step
            eps=(spec["eps"], 1e-3),
            clip_threshold=1.0,
            decay_rate=-0.8,
            beta1=spec["beta1"],
            scale_parameter=False,
            relative_step=False,
            warmup_init=False,
        )
    raise SystemExit(f"unknown optimizer {spec['name']!r}")


def main() -> None:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    results = []
    for spec in job["optimizers"]:
        params = {
            name: torch.tensor(p["values"], dtype=torch.float32).reshape(p["shape"]).requires_grad_()
            for name, p in job["params"].items()
        }
        opt = build(spec, params)
        for step in job["steps"]:
            for name, p in params.items():
                p.grad = torch.tensor(step["grads"][name], dtype=torch.float32).reshape(p.shape)
            for group in opt.param_groups:
                group["lr"] = step["lr"]
            opt.step()
        results.append({name: p.detach().flatten().tolist() for name, p in params.items()})
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
