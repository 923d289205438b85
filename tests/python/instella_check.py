"""Independent checks of our Instella reference implementation (tests/python/instella/), run by
tests/tests/instella_reference.rs. Each check is named; the results go to --out as JSON
{name: {"ok": bool, "detail": str}} (one process for all: importing torch costs seconds on a busy
2-core machine).

  forward_f64        the model's logits (eager and SDPA, float32) against a forward written here
                     from the architecture's description in numpy float64: MHA with q/k norms over
                     the whole projections, untied head, a non-default RoPE theta; and GQA, tied head
  loss               model(labels=...).loss against numpy cross-entropy of the next token, -100 skipped
  cached_decode      a prefill then one-token steps through the KV cache give the full forward's
                     logits; greedy `generate` (cache, batched, one row left-padded) gives the tokens
                     of the argmax loop over full forwards of each row alone
  packed_rows        a row of two documents (position ids restarting, no mask, no cache: how
                     transformers recognises packing) gives the second document's logits as the
                     document alone
  hub_layout         a saved directory has the code files and auto_map and loads through
                     AutoModelForCausalLM with trust_remote_code=True running that directory's copy
  published_config   amd/Instella-3B-Instruct's config.json reads into our config with its values,
                     and the model it describes has the published checkpoint's size

    python tests/python/instella_check.py --out RESULTS.json [CHECK ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from instella import InstellaConfig, published_3b_config, random_model, save_with_code  # noqa: E402

VOCAB = 61

MHA = dict(
    vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, rope_theta=500.0, rms_norm_eps=1e-5, max_position_embeddings=64,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=1,
)
GQA = dict(MHA, num_attention_heads=6, num_key_value_heads=2, hidden_size=36, rope_theta=10000.0,
           rms_norm_eps=1e-6, tie_word_embeddings=True)


def model_of(fields: dict, attn: str = "eager", seed: int = 3):
    """A tiny Instella whose weights make every part matter: transformers' init (std 0.02) leaves
    activations so small that attention is nearly uniform and the norms' gains near 1."""
    torch.manual_seed(seed)
    model = random_model(InstellaConfig(**fields), attn=attn)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn_like(p))
            else:  # projections: unit-variance outputs from unit-variance inputs
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))
    model.eval()
    return model


# ---- the numpy float64 forward, from the architecture's description ----

def rms(x, w, eps):
    return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def rope(x, pos, theta):
    """x [seq, head_dim] of one head; rotates the pairs (i, i + head_dim/2) by pos * theta^(-2i/head_dim)."""
    d = x.shape[-1]
    half = d // 2
    out = np.empty_like(x)
    for i in range(half):
        angle = pos * theta ** (-2.0 * i / d)
        c, s = np.cos(angle), np.sin(angle)
        out[:, i] = x[:, i] * c - x[:, i + half] * s
        out[:, i + half] = x[:, i + half] * c + x[:, i] * s
    return out


def f64_logits(model, ids: list[int], positions: list[int] | None = None) -> np.ndarray:
    """Logits [seq, vocab] of one row, causal attention over the whole row."""
    c = model.config
    w = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    d = c.hidden_size // heads
    eps, theta = c.rms_norm_eps, c.rope_parameters["rope_theta"]
    t = len(ids)
    pos = np.arange(t, dtype=np.float64) if positions is None else np.array(positions, dtype=np.float64)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "pre_attention_layernorm.weight"], eps)
        q = rms(h @ w[p + "self_attn.q_proj.weight"].T, w[p + "self_attn.q_norm.weight"], eps)
        k = rms(h @ w[p + "self_attn.k_proj.weight"].T, w[p + "self_attn.k_norm.weight"], eps)
        v = h @ w[p + "self_attn.v_proj.weight"].T
        out = np.zeros((t, heads * d))
        for head in range(heads):
            kv = head // (heads // kv_heads)
            qh = rope(q[:, head * d:(head + 1) * d], pos, theta)
            kh = rope(k[:, kv * d:(kv + 1) * d], pos, theta)
            vh = v[:, kv * d:(kv + 1) * d]
            for r in range(t):
                s = kh[: r + 1] @ qh[r] / math.sqrt(d)
                e = np.exp(s - s.max())
                out[r, head * d:(head + 1) * d] = (e / e.sum()) @ vh[: r + 1]
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "pre_feedforward_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    return x @ head.T


IDS = [[5, 17, 3, 60, 2, 9, 33, 41], [7, 7, 0, 12, 58, 1, 25, 4]]


def worst(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.abs(got.detach().double().numpy() - want).max())


def check_forward_f64() -> str:
    lines = []
    for label, fields in (("MHA untied, theta 500", MHA), ("GQA 6/2, tied", GQA)):
        want = np.stack([f64_logits(model_of(fields), row) for row in IDS])
        scale = float(np.abs(want).max())
        assert scale > 1.0, f"{label}: logits too small to tell anything apart ({scale})"
        for attn in ("eager", "sdpa"):
            with torch.no_grad():
                got = model_of(fields, attn).forward(torch.tensor(IDS)).logits
            err = worst(got, want)
            lines.append(f"{label} {attn}: max |diff| {err:.2e} (max |logit| {scale:.1f})")
            assert err < 2e-5 * scale, lines[-1]
        if fields["tie_word_embeddings"]:
            m = model_of(fields)
            assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr(), "lm_head not tied"
    return "; ".join(lines)


def check_loss() -> str:
    model = model_of(MHA)
    labels = [[-100, 17, 3, 60, 2, 9, 33, 41], [7, 7, 0, -100, 58, 1, -100, -100]]
    with torch.no_grad():
        got = model(input_ids=torch.tensor(IDS), labels=torch.tensor(labels)).loss.item()
    terms = []
    for row, lab in zip(IDS, labels):
        logits = f64_logits(model, row)
        for t in range(len(row) - 1):  # position t predicts label t + 1
            if lab[t + 1] != -100:
                z = logits[t]
                terms.append(np.log(np.exp(z - z.max()).sum()) + z.max() - z[lab[t + 1]])
    want = float(np.mean(terms))
    detail = f"loss {got:.6f}, numpy {want:.6f} over {len(terms)} targets"
    assert abs(got - want) < 1e-5 * max(1.0, want), detail
    return detail


def check_cached_decode() -> str:
    model = model_of(MHA)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        out = model(input_ids=ids[:, :3], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(3, ids.shape[1]):
            out = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
        err = float((torch.cat(steps, dim=1) - full).abs().max())
    assert cache.get_seq_length() == ids.shape[1], f"cache holds {cache.get_seq_length()} positions"
    assert err < 1e-4, f"cached decode logits differ from the full forward by {err}"

    new = 10
    prompts = [IDS[0][:6], IDS[1][:4]]  # the second row is left-padded to the first's length

    def argmax_loop(prompt):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(new):
                seq.append(int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
        return seq[len(prompt):]

    pad = model.config.pad_token_id
    width = max(map(len, prompts))
    batch = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        gen = model.generate(input_ids=batch, attention_mask=mask, max_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=pad)
    got = gen[:, width:].tolist()
    want = [argmax_loop(p) for p in prompts]
    assert got == want, f"generate {got} != argmax loop {want}"
    assert len(set(map(tuple, want))) > 1 and len(set(want[0])) > 1, f"degenerate tokens {want}"
    return f"cached steps within {err:.1e} of the full forward; generate == argmax loop: {want}"


def check_packed_rows() -> str:
    first, second = IDS[0][:3], IDS[1]
    row = torch.tensor([first + second])
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))])
    details = []
    for attn in ("eager", "sdpa"):
        model = model_of(MHA, attn)
        with torch.no_grad():
            # transformers finds packed documents only when no KV cache is made (masking_utils), as
            # in training; the config's use_cache=True would make one.
            packed = model(input_ids=row, position_ids=positions, use_cache=False).logits[0, len(first):]
            alone = model(input_ids=torch.tensor([second])).logits[0]
        err = float((packed - alone).abs().max())
        details.append(f"{attn}: {err:.1e}")
        assert err < 1e-4, f"{attn}: the second document sees the first ({err})"
    return "packed vs alone max |diff| " + ", ".join(details)


def check_hub_layout() -> str:
    from transformers import AutoModelForCausalLM

    model = model_of(GQA)
    ids = torch.tensor(IDS)
    with tempfile.TemporaryDirectory() as out:
        save_with_code(model, out)
        with open(os.path.join(out, "config.json")) as f:
            auto_map = json.load(f)["auto_map"]
        assert auto_map == {
            "AutoConfig": "configuration_instella.InstellaConfig",
            "AutoModelForCausalLM": "modeling_instella.InstellaForCausalLM",
        }, auto_map
        for name in ("configuration_instella.py", "modeling_instella.py"):
            assert os.path.isfile(os.path.join(out, name)), f"{name} not saved beside the weights"
        loaded = AutoModelForCausalLM.from_pretrained(
            out, trust_remote_code=True, dtype=torch.float32, attn_implementation="eager"
        )
        module = type(loaded).__module__
        assert module.startswith("transformers_modules."), f"loaded {module}, not the directory's code"
        with torch.no_grad():
            err = float((loaded(ids).logits - model(ids).logits).abs().max())
    assert err == 0.0, f"reloaded logits differ by {err}"
    return f"auto_map {auto_map}; loaded as {module}.{type(loaded).__name__}, same logits"


# amd/Instella-3B-Instruct on the hub: model-00001-of-00002.safetensors 4.98 GB + model-00002 1.24 GB
# of bfloat16 weights (the file listing as published; sizes rounded to 10 MB).
PUBLISHED_WEIGHT_BYTES = 4.98e9 + 1.24e9


def check_published_config() -> str:
    c = published_3b_config()
    got = dict(layers=c.num_hidden_layers, hidden=c.hidden_size, heads=c.num_attention_heads,
               kv_heads=c.num_key_value_heads, head_dim=c.head_dim, ffn=c.intermediate_size, vocab=c.vocab_size,
               theta=c.rope_parameters["rope_theta"], rope=c.rope_parameters["rope_type"],
               max_pos=c.max_position_embeddings, eps=c.rms_norm_eps, tied=c.tie_word_embeddings,
               bos=c.bos_token_id, eos=c.eos_token_id, pad=c.pad_token_id, act=c.hidden_act)
    want = dict(layers=36, hidden=2560, heads=32, kv_heads=32, head_dim=80, ffn=6912, vocab=50304, theta=10000.0,
                rope="default", max_pos=4096, eps=1e-5, tied=False, bos=0, eos=0, pad=1, act="silu")
    assert got == want, f"{got} != {want}"
    with torch.device("meta"):
        model = random_model(c)
    params = sum(p.numel() for p in model.parameters())
    ratio = 2 * params / PUBLISHED_WEIGHT_BYTES
    detail = f"{want}; {params:,} parameters = {2 * params / 1e9:.3f} GB in bf16 vs 6.22 GB published"
    assert abs(ratio - 1) < 0.005, detail
    return detail


CHECKS = {
    "forward_f64": check_forward_f64,
    "loss": check_loss,
    "cached_decode": check_cached_decode,
    "packed_rows": check_packed_rows,
    "hub_layout": check_hub_layout,
    "published_config": check_published_config,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("checks", nargs="*", help=f"some of {', '.join(CHECKS)} (default: all)")
    a = p.parse_args()
    if unknown := set(a.checks) - set(CHECKS):
        p.error(f"unknown checks {sorted(unknown)}")
    results = {}
    for name in a.checks or CHECKS:
        try:
            results[name] = {"ok": True, "detail": CHECKS[name]()}
        except Exception as e:  # every check reports, whatever the others do
            results[name] = {"ok": False, "detail": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        print(f"{name}: {'ok' if results[name]['ok'] else 'FAILED'}: {results[name]['detail']}", file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
