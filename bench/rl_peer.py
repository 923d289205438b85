"""The peer of bench/rl.sh: TRL's `GRPOTrainer` (trl 1.16) with the settings of our GRPO step
benchmark (trainer/examples/rl_bench.rs), in its own process on the same GPU in the same call.

    python3 bench/rl_peer.py --out FILE [--shape 8B] [--device cuda] [--steps 4] [--prompts 8]
        [--generations 8] [--new-tokens 256] [--seq-len 2048] [--r 16] [--micro 8]
        [--sample-vocab byte|full] [--no-gradient-checkpointing]
    python3 bench/rl_peer.py --device cpu --shape tiny --steps 3 --prompts 2 --generations 4 \
        --new-tokens 16 --seq-len 128 --r 4 --out /tmp/peer.jsonl      (a CPU smoke run, fp32)

What runs, and how it matches ours:
* the model: a random-init HF `Qwen3ForCausalLM` of rl_bench's shape (8B: hidden 4096, 36 layers,
  32/8 heads, head_dim 128, ffn 12288, vocab 151936, untied), built on the device in bf16
  (fp32 on the CPU), normal(0, 0.02) weights from torch seed 0, SDPA attention;
* LoRA r16 α32 (α = 2r, as rl_bench), dropout 0, on q,k,v,o,gate,up,down through PEFT
  (`peft_config=`), so the reference policy is the base with the adapter off, as ours;
* a step = 8 prompts × `num_generations` 8 = 64 completions of at most `max_completion_length`
  256 tokens sampled by HF `generate` (`use_vllm=False`, TRL's default dynamic cache), temperature
  1.0, top-p 1.0, no top-k (ours: the same), then one policy update: per_device_train_batch_size
  = MICRO (8) completions × gradient_accumulation_steps = 64 / MICRO (8), which makes TRL's
  `steps_per_generation` = 8 and `generation_batch_size` = 64 (its defaults derived from those
  two): one generation round of 64 completions per optimizer step, so ratios are 1 and no old
  log-probs are computed (`num_iterations` 1), as ours. MICRO 8 rows of ~300 tokens is about the
  2048 tokens of our one packed micro-batch row;
* loss: beta (KL) 0.04 with the k3 estimator against the reference, epsilon 0.2, `loss_type`
  "grpo" (each completion's token mean, then the mean over completions: ours), `scale_rewards`
  "group" ((r − mean)/(std + 1e-4) within a prompt's group: ours); AdamW (transformers' default,
  fused; gradient-norm clipping at 1.0, also its default) at lr 1e-5, constant schedule; bf16
  autocast with the adapters in fp32 (PEFT's default);
* gradient checkpointing ON: TRL's default (`GRPOConfig.gradient_checkpointing=True`), so what a
  user who does not change it runs; ours does not recompute. `--no-gradient-checkpointing`
  turns it off;
* prompts: tasks of the families our `generated` source draws (parity, letter count, last
  letter, review, tool questions, currency conversion with its one-line system message), rendered
  as ChatML text and tokenised by a byte tokenizer built here (no download; the GPU machine has no
  network) with the ids of ours: 0..255 the bytes, 256..265 Qwen3's specials
  (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|pad|>`, `<tool_call>`, ...), then one
  placeholder token per remaining model row so any sampled id decodes; `<|im_end|>` and
  `<|endoftext|>` end a completion, `<|pad|>` pads (ours);
* sampling vocabulary (`--sample-vocab`): `byte` (default) samples among the tokenizer's 266
  ids, as our engine does (it samples within `min(tokenizer vocab, model vocab)`), through
  `generation_kwargs={"suppress_tokens": [266, ..., vocab-1]}`; with random weights the two stop
  ids then end a completion after ~100 tokens on average, on both sides (ours at 8B:
  1,975 tok/s × at most 3.20 s ≈ 6,300 sampled tokens for 64 completions). `full` samples over all
  151,936 rows: a stop id is then practically never drawn and every completion runs to 256;
* rewards: numeric_match, format, exact_match as plain Python functions over the decoded
  completions (docs/recipes.md's definitions, simplified; with random weights they score ~0:
  only the time matters).

Timing (a `TrainerCallback`, `torch.cuda.synchronize()` at each mark): the first step is warm-up
and left out; `grpo_step_s` is the wall time from one step's end to the next (as rl_bench's
observer), the rollout is TRL's `_generate` (prompt tokenisation, `model.generate` with the
adapter switched for generation, decoding), wrapped and synchronised; `grpo_policy_s` = step −
rollout (TRL's rewards, reference log-probs, the 8 forward+backward micro-steps with
recomputation, the optimizer step and the trainer's own bookkeeping: ours' `policy_s` counts the
reference and the forward+backward only, the rewards and optimizer are outside it and small);
`grpo_rollout_tokens_per_s` = sampled tokens / rollout seconds; `grpo_policy_tokens_per_s` =
the 64 sequences' prompt + completion tokens / policy seconds (ours: the tokens of its packed
rows over `policy_s`). Each metric is the mean over the measured steps (rl_bench's statistic);
the median rides along as `peer_median`. Also `grpo_peak_memory_bytes`
(`torch.cuda.max_memory_allocated`) and `grpo_completion_tokens_mean`.

Writes one JSON object per metric, `{"metric", "peer", "peer_median", "settings"}`, to --out and
prints them; progress goes to stderr. Exit 3 when trl (or datasets) cannot be imported.
"""
import argparse
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time

# rl_bench.rs `shape`: (hidden, layers, heads, kv heads, head dim, ffn, vocab, tied)
SHAPES = {
    "8B": (4096, 36, 32, 8, 128, 12288, 151936, False),
    "1.7B": (2048, 28, 16, 8, 128, 6144, 151936, True),
    "0.6B": (1024, 28, 16, 8, 128, 3072, 151936, True),
    "tiny": (64, 2, 4, 2, 16, 128, 512, True),
}
# Our byte tokenizer (trainer/src/data/tokenizer/byte.rs): 256 bytes, then these at 256..265.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<tool_call>", "</tool_call>",
            "<think>", "</think>", "<tool_response>", "</tool_response>"]
CONTROL = SPECIALS[:4]
BYTE_VOCAB = 256 + len(SPECIALS)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def bytes_to_unicode():
    """GPT-2's byte ↔ printable-char table, which `tokenizers`' ByteLevel pre-tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_encode(text):
    """Our byte tokenizer's `encode` with control tokens recognised (byte.rs), to check the HF one."""
    ids, i, raw = [], 0, text.encode()
    while i < len(raw):
        hit = next((k for k, s in enumerate(SPECIALS) if raw.startswith(s.encode(), i)), None)
        if hit is None:
            ids.append(raw[i])
            i += 1
        else:
            ids.append(256 + hit)
            i += len(SPECIALS[hit])
    return ids


def byte_tokenizer(vocab_size):
    """A `PreTrainedTokenizerFast` with our byte tokenizer's ids, padded with placeholder tokens
    `<tN>` up to the model's vocabulary so that every id a random model samples decodes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    for i, s in enumerate(SPECIALS):
        vocab[s] = 256 + i
    for i in range(BYTE_VOCAB, vocab_size):
        vocab[f"<t{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    # Already in the vocabulary, so they keep ids 256..265. Control tokens are special (skipped
    # when decoding); the markup ones are text the model writes, as in Qwen3's tokenizer.
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in CONTROL])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in SPECIALS[4:]])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                   model_max_length=1 << 20)


# ---- prompts: the families of trainer/src/data/generator.rs ----------------------------------

LETTERS = "abcdefghijklmnopqrstuvwxyz"
NAMES = ["Ada", "Bo", "Cleo", "Dmitri", "Esme", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Lars"]
TOOLS = [("get_weather", "How is the weather?"), ("get_time", "What is the time?"), ("get_news", "Any news?")]


def tool_text(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def task(rng, multi_arg_tools):
    """(system, user prompt, reference answer text)."""
    kind = rng.randrange(5)
    if kind == 0:
        n = rng.randint(100, 9_999_999)
        return None, f"Is {n} even or odd?", "even" if n % 2 == 0 else "odd"
    if kind == 1:
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(4, 7)))
        if rng.randrange(2) == 0:
            return None, f"How many letters in {word}?", str(len(word))
        return None, f"Last letter of {word}?", word[-1]
    if kind == 2:
        thing = rng.choice(["room", "food", "staff", "view", "trip", "show"])
        good = rng.randrange(2) == 0
        word = rng.choice(["great", "lovely", "superb", "fine"] if good else ["awful", "poor", "dull", "boring"])
        return None, f"Review: the {thing} in {rng.choice(NAMES)} was {word}.", "positive" if good else "negative"
    if multi_arg_tools and rng.randrange(2) == 0:
        cur = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD"]
        amount, a = rng.randint(1, 999), rng.choice(cur)
        b = rng.choice([c for c in cur if c != a])
        return ("convert(amount, from, to)", f"Convert {amount} {a} to {b}.",
                tool_text("convert", {"amount": amount, "from": a, "to": b}))
    name, question = rng.choice(TOOLS)
    return None, f"I am {rng.choice(NAMES)}. {question}", tool_text(name, {})


def chatml(system, user):
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return head + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


# ---- rewards (docs/recipes.md), over decoded completions; None = not scored ------------------

THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.S)
TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def answer_of(text):
    return THINK.sub("", text, count=1).strip()


def tool_calls(text):
    """The answer's tool calls as parsed JSON when it is only `<tool_call>` blocks, else None."""
    if not text.startswith("<tool_call>") or TOOL_BLOCK.sub("", text).strip():
        return None
    try:
        return [json.loads(b) for b in TOOL_BLOCK.findall(text)]
    except ValueError:
        return None


def final_number(text):
    boxed = re.findall(r"\\boxed\{([^}]*)\}", text)
    if boxed:
        text = boxed[-1]
    elif "####" in text:
        text = text.rsplit("####", 1)[1]
    nums = NUMBER.findall(text)
    if not nums:
        return None
    try:
        return float(nums[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_match(completions, answer, **_):
    out = []
    for c, ref in zip(completions, answer):
        want = None if ref.startswith("<tool_call>") else final_number(ref)
        out.append(None if want is None else float(final_number(answer_of(c)) == want))
    return out


def exact_match(completions, answer, **_):
    out = []
    for c, ref in zip(completions, answer):
        a = answer_of(c)
        out.append(float(tool_calls(a) == tool_calls(ref) if ref.startswith("<tool_call>") else a == ref.strip()))
    return out


def make_format(stop_ids):
    def format_reward(completions, completion_ids, answer, **_):
        out = []
        for c, ids, ref in zip(completions, completion_ids, answer):
            ended = bool(ids) and ids[-1] in stop_ids
            think_ok = c.count("<think>") == c.count("</think>") <= 1 and (
                "<think>" not in c or c.lstrip().startswith("<think>"))
            a = answer_of(c)
            calls_ok = (tool_calls(a) is not None) == ref.startswith("<tool_call>")
            out.append(float(ended and think_ok and bool(a) and calls_ok))
        return out

    format_reward.__name__ = "format"
    return format_reward


# ---- the run ----------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="8B", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default=None, choices=["bf16", "fp32"], help="bf16 on cuda, fp32 on cpu by default")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps, the first one warm-up")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--micro", type=int, default=8, help="per_device_train_batch_size (completions)")
    p.add_argument("--sample-vocab", default="byte", choices=["byte", "full"])
    p.add_argument("--no-gradient-checkpointing", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps 2 at least: the first step is warm-up")
    dtype_name = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    completions = args.prompts * args.generations
    micro = min(args.micro, completions)
    if completions % micro:
        p.error(f"--micro {micro} must divide prompts × generations = {completions}")

    try:
        import datasets
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except Exception as e:  # noqa: BLE001 - any import failure means no peer
        log(f"rl_peer: TRL is not importable ({type(e).__name__}: {e}); carry its wheels in .whl/ "
            "(trl, datasets, dill, multiprocess; docs/benchmarks.md) and put them on PYTHONPATH")
        sys.exit(3)
    import peft
    import torch
    import transformers
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, Qwen3Config, TrainerCallback

    t_start = time.perf_counter()
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    hidden, layers, heads, kv, hd, ffn, vocab, tied = SHAPES[args.shape]
    log(f"rl_peer: trl {trl.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
        f"datasets {datasets.__version__}, torch {torch.__version__}; {args.shape} on {args.device} in {dtype_name}")

    tokenizer = byte_tokenizer(vocab)
    stop_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    pad_id = tokenizer.pad_token_id
    assert stop_ids == [258, 256] and pad_id == 259, (stop_ids, pad_id)

    # Prompts: 2000 tasks as our recipe's generator (count 2000); prompts that leave no room for
    # the completion are left out, as ours does.
    rng = random.Random(args.seed + 1)
    rows = []
    for _ in range(2000):
        system, user, ref = task(rng, args.seq_len >= 192)
        text = chatml(system, user)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= args.seq_len - args.new_tokens:
            rows.append({"prompt": text, "answer": ref})
    # The tokenizer as ours: byte ids and single-id specials, text round-trips, any id decodes.
    probe = rows[0]["prompt"] + "é <tool_call>"
    ids = tokenizer(probe, add_special_tokens=False)["input_ids"]
    assert ids == byte_encode(probe), (ids, byte_encode(probe))
    assert tokenizer.decode(ids) == probe, tokenizer.decode(ids)
    tokenizer.batch_decode([list(range(0, vocab, 1)), [vocab - 1, 0, 255, 258]], skip_special_tokens=True)
    # Built from an Arrow table with a fingerprint of our own: `Dataset.from_list` hashes the table
    # with dill, which failed here with pyarrow 21 (datasets 5.2 asks for >= 24; the GPU image's
    # pyarrow version is not recorded).
    import pyarrow
    dataset = datasets.Dataset(pyarrow.Table.from_pylist(rows), fingerprint=f"rl-peer-{args.seed}-{len(rows)}")

    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=1e-6,
                      rope_theta=1e6, tie_word_embeddings=tied, max_position_embeddings=args.seq_len,
                      bos_token_id=None, eos_token_id=stop_ids, pad_token_id=pad_id)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    t = time.perf_counter()
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)  # normal(0, 0.02) init, on the device
    sync()
    log(f"rl_peer: model built in {time.perf_counter() - t:.1f} s "
        f"({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters)")

    gen_kwargs = None
    if args.sample_vocab == "byte" and vocab > BYTE_VOCAB:
        gen_kwargs = {"suppress_tokens": list(range(BYTE_VOCAB, vocab))}
    out_dir = tempfile.mkdtemp(prefix="rl-peer-")
    config = GRPOConfig(
        output_dir=out_dir,
        max_steps=args.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro,  # => steps_per_generation, generation_batch_size
        num_generations=args.generations,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.04,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        num_iterations=1,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        use_vllm=False,
        generation_kwargs=gen_kwargs,
        gradient_checkpointing=not args.no_gradient_checkpointing,  # TRL's default: True
        bf16=dtype_name == "bf16",
        use_cpu=not cuda,
        seed=args.seed,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",  # logging_steps: TRL's default (10), so no log inside the timed steps
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    peft_config = LoraConfig(r=args.r, lora_alpha=2 * args.r, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"])
    trainer = GRPOTrainer(model=model, reward_funcs=[numeric_match, make_format(set(stop_ids)), exact_match],
                          args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config)
    from transformers.trainer_callback import PrinterCallback
    trainer.remove_callback(PrinterCallback)  # TRL's logs would go to stdout, which carries our JSON
    assert trainer.args.steps_per_generation == completions // micro
    assert trainer.args.generation_batch_size == completions, trainer.args.generation_batch_size

    # One record per optimizer step.
    steps = []
    current = {}

    generate = trainer._generate

    def timed_generate(prompts):
        sync()
        t0 = time.perf_counter()
        result = generate(prompts)
        sync()
        current["rollout_s"] = current.get("rollout_s", 0.0) + time.perf_counter() - t0
        prompt_ids, completion_ids = result[0], result[1]
        current["sampled"] = current.get("sampled", 0) + sum(len(c) for c in completion_ids)
        current["prompt_tokens"] = current.get("prompt_tokens", 0) + sum(len(q) for q in prompt_ids)
        current["completions"] = current.get("completions", 0) + len(completion_ids)
        return result

    trainer._generate = timed_generate

    class Clock(TrainerCallback):
        def __init__(self):
            self.last_end = None

        def on_train_begin(self, *_a, **_k):
            sync()
            self.last_end = time.perf_counter()

        def on_step_begin(self, *_a, **_k):
            sync()
            current.clear()
            current["begin"] = time.perf_counter()

        def on_step_end(self, _args, state, *_a, **_k):
            sync()
            now = time.perf_counter()
            rec = dict(current, step=state.global_step, step_s=now - self.last_end, work_s=now - current["begin"])
            self.last_end = now
            steps.append(rec)
            log(f"rl_peer: step {rec['step']}/{args.steps}: {rec['step_s']:.2f} s, rollout "
                f"{rec.get('rollout_s', float('nan')):.2f} s, {rec.get('completions', 0)} completions, "
                f"{rec.get('sampled', 0)} sampled tokens")

    trainer.add_callback(Clock())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    log(f"rl_peer: ready after {time.perf_counter() - t_start:.1f} s; training {args.steps} steps")
    trainer.train()

    warm = steps[1:]
    if not warm or any("rollout_s" not in s for s in warm):
        log(f"rl_peer: steps without a rollout: {steps}")
        sys.exit(1)
    for s in warm:
        s["policy_s"] = s["step_s"] - s["rollout_s"]
        s["rollout_tps"] = s["sampled"] / s["rollout_s"]
        s["policy_tps"] = (s["prompt_tokens"] + s["sampled"]) / s["policy_s"]
        s["completion_mean"] = s["sampled"] / s["completions"]

    def stat(key):
        vals = [s[key] for s in warm]
        return statistics.fmean(vals), statistics.median(vals)

    settings = {
        "shape": args.shape, "device": args.device, "dtype": dtype_name, "prompts": args.prompts,
        "generations": args.generations, "new_tokens": args.new_tokens, "seq_len": args.seq_len, "lora_r": args.r,
        "lora_alpha": 2 * args.r, "steps_measured": len(warm), "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": completions // micro,
        "steps_per_generation": trainer.args.steps_per_generation,
        "generation_batch_size": trainer.args.generation_batch_size,
        "gradient_checkpointing": not args.no_gradient_checkpointing, "sample_vocab": args.sample_vocab,
        "beta": 0.04, "epsilon": 0.2, "loss_type": "grpo", "lr": 1e-5, "temperature": 1.0, "top_p": 1.0,
        "generation": "hf-generate", "attention": "sdpa", "completions_per_step": completions,
        "prompt_tokens_mean": statistics.fmean(s["prompt_tokens"] / s["completions"] for s in warm),
        "step_s_list": [round(s["step_s"], 4) for s in warm],
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                     "datasets": datasets.__version__, "torch": torch.__version__},
    }
    if cuda:
        settings["gpu"] = torch.cuda.get_device_name(0)
    metrics = [
        ("grpo_step_s", *stat("step_s")),
        ("grpo_rollout_tokens_per_s", *stat("rollout_tps")),
        ("grpo_policy_tokens_per_s", *stat("policy_tps")),
        ("grpo_rollout_s", *stat("rollout_s")),
        ("grpo_policy_s", *stat("policy_s")),
        ("grpo_completion_tokens_mean", *stat("completion_mean")),
    ]
    peak = torch.cuda.max_memory_allocated() if cuda else None
    metrics.append(("grpo_peak_memory_bytes", peak, peak))
    with open(args.out, "w") as f:
        for name, mean, median in metrics:
            line = json.dumps({"metric": name, "peer": mean, "peer_median": median, "settings": settings})
            print(line, flush=True)
            f.write(line + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    log(f"rl_peer: done in {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
