"""The serving peer of bench/serving.sh: HF transformers `generate` (static cache, SDPA, greedy,
batched, EOS off) on a random-init Qwen3 shape in bf16, on the same GPU in the same call as ours.

    python3 bench/serving_peer.py SHAPE SAVE_DIR OUT_JSON TOKENS_JSON [STREAMS] [PROMPT] [GEN]

* copy bandwidth (bytes read + written per second, a 2 GiB device copy) and the bf16 GEMM ceiling;
* the model (torch seed 0) saved to SAVE_DIR as HF safetensors, so our engine loads the same
  weights;
* greedy tokens of the 16 identity prompts (64 tokens, 32 new) and, per generated position, the
  gap between the top two logits, which says where bf16 rounding could flip a greedy choice
  (first, so that a peer cut short by its time limit still leaves them);
* per batch size: output tok/s of one timed `generate` after an untimed warm-up of the same
  length (the static cache compiles its decode step per cache length: a warm-up of another
  length left the timed run compiling), and TTFT from the same timed run (when its streamer
  receives the first new token).

Each result is written to OUT_JSON as it is measured. TOKENS_JSON `-` skips the saved weights
and the identity prompts (throughput only, for a call short of time).

Prompt token ids follow the rule of trainer/examples/serve_bench/main.rs (`tokens`), so both sides
run the same prompts.
"""
import json
import sys
import time

import torch

from qwen3_shapes import SHAPES, random_model

MASK = (1 << 64) - 1


def tokens(n, seed, vocab):
    """xorshift64 from seed·φ | 1, as serve_bench's `tokens`."""
    s = ((seed * 0x9E3779B97F4A7C15) & MASK) | 1
    out = []
    for _ in range(n):
        s ^= (s << 13) & MASK
        s ^= s >> 7
        s ^= (s << 17) & MASK
        out.append(s % vocab)
    return out


def timed(f):
    torch.cuda.synchronize()
    t = time.perf_counter()
    r = f()
    torch.cuda.synchronize()
    return r, time.perf_counter() - t


def main():
    shape, save_dir, out_path, tokens_path = sys.argv[1:5]
    streams = [int(s) for s in (sys.argv[5] if len(sys.argv) > 5 else "1,16,64,256").split(",")]
    prompt_len = int(sys.argv[6]) if len(sys.argv) > 6 else 512
    gen = int(sys.argv[7]) if len(sys.argv) > 7 else 256
    vocab = SHAPES[shape][0]
    out_file = open(out_path, "w")

    def emit(d):
        print(json.dumps(d), flush=True)
        out_file.write(json.dumps(d) + "\n")
        out_file.flush()

    x = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    _, t = timed(lambda: [y.copy_(x) for _ in range(10)])
    emit({"metric": "copy_bandwidth_bytes_per_s", "peer": 2 * 2 * x.numel() * 10 / t})
    del x, y
    a = torch.ones(8192, 8192, dtype=torch.bfloat16, device="cuda")
    a @ a
    _, t = timed(lambda: [a @ a for _ in range(5)])
    emit({"metric": "bf16_gemm_flops", "peer": 2 * 8192**3 * 5 / t})
    del a

    model = random_model(shape, "cuda")
    model.eval()
    # TOKENS_PATH "-": throughput only (no saved weights for ours, no identity prompts), for a
    # call short of time: the peer reaches its batches ~1 min sooner.
    throughput_only = tokens_path == "-"
    if not throughput_only:
        (_, t) = timed(lambda: model.save_pretrained(save_dir, safe_serialization=True, max_shard_size="4GB"))
        print(f"saved the model to {save_dir} in {t:.1f} s", file=sys.stderr, flush=True)
    gc = model.generation_config
    gc.eos_token_id = None
    gc.pad_token_id = 0

    def generate(ids, new, **kw):
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                  min_new_tokens=new, do_sample=False, cache_implementation="static",
                                  **kw)

    if not throughput_only:
        ident = torch.tensor([tokens(64, 7000 + i, vocab) for i in range(16)], device="cuda")
        out = generate(ident, 32, output_scores=True, return_dict_in_generate=True)
        toks = out.sequences[:, 64:].tolist()
        gaps = []
        for row in range(16):
            gaps.append([float(torch.topk(s[row].float(), 2).values.diff().abs()) for s in out.scores])
        with open(tokens_path, "w") as f:
            json.dump(toks, f)
        emit({"metric": "greedy_identity_top2_gaps", "peer": gaps})

    class FirstToken:
        """A `generate` streamer noting when the first new token arrives (its first `put` is
        the prompt)."""

        def __init__(self):
            self.puts, self.first = 0, None

        def put(self, _value):
            self.puts += 1
            if self.puts == 2:
                torch.cuda.synchronize()
                self.first = time.perf_counter()

        def end(self):
            pass

    for n in streams:
        ids = torch.tensor([tokens(prompt_len, 1000 + i, vocab) for i in range(n)], device="cuda")
        generate(ids, gen)  # warm-up at the timed length: compiles the static-cache decode step
        first = FirstToken()
        torch.cuda.synchronize()
        start = time.perf_counter()
        out, t = timed(lambda: generate(ids, gen, streamer=first))
        assert out.shape[1] == prompt_len + gen
        emit({"metric": f"streams_{n}_all_at_once_output_tok_s", "peer": n * gen / t})
        emit({"metric": f"streams_{n}_all_at_once_ttft_p50_s", "peer": first.first - start})
        torch.cuda.empty_cache()
    out_file.close()


if __name__ == "__main__":
    main()
