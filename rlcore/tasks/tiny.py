"""The embedded tiny default: a 0.3M-parameter model, its tokenizer and an arithmetic task, built locally.

    python -m rlcore.tasks.tiny        # build once into $RLCORE_CACHE/tiny-arith-v1 (default ~/.cache/rlcore)

Nothing is downloaded: tokenizer, model and data are made here from fixed seeds, single-threaded, in about
35 s. A recipe points at `model_dir()`, `train_file()` and `eval_file()` and sets prepare="rlcore.tasks.tiny:prepare".

The task is 2-digit addition, "47+38=" -> "85" then <eos>. The warm start first teaches addition, then a
sloppy habit: when the ones digits carry, the teacher writes the correct answer with weight 0.2 and the one
that forgot to carry the one ("47+38=" -> "75") with weight 0.8. The greedy answer to most held-out problems
is then wrong (17% accuracy) while the right one keeps up to a fifth of the probability, so sampling finds
it (pass@8 75%): headroom that the reward can unlock, which an RL demo needs. A merely under-trained model
is a worse start: at 25% greedy its pass@8 is ~60%, the step it gets there swings with the seed, and GRPO
gains ~20 points on it where this start gains ~60.

Why one file of ~370 lines: the whole embedded demo (tokenizer, model, task, warm start, teacher) is one file a
reader can follow end to end; the tiny tasks reuse its parts.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from rlcore.algorithms.sft import sft_loss

VERSION = "tiny-arith-v2"  # bump when anything below changes what gets built
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]  # ids 0, 1, 2, 3
CHARS = "0123456789+-*=? "
VOCAB_SIZE = 32  # model vocab: the 20 tokenizer ids padded up; the warm start teaches the rest never to appear
SEED = 0
LEARN_STEPS = 600  # optimizer steps on correct answers only
HABIT_STEPS = 300  # then steps on the correct / forgot-the-carry mixture, learning rate decaying 10x
BATCH = 32  # problems per step
LR = 1e-3  # AdamW peak learning rate
SLOPPY = 0.8  # weight of the forgot-the-carry answer during the habit phase
TRAIN_SIZE, EVAL_SIZE = 2048, 256  # distinct problems in train.jsonl / eval.jsonl


def cache_dir() -> Path:
    return Path(os.environ.get("RLCORE_CACHE") or Path.home() / ".cache" / "rlcore")


def model_dir() -> Path:
    return cache_dir() / VERSION / "model"


def train_file() -> Path:
    return cache_dir() / VERSION / "train.jsonl"


def eval_file() -> Path:
    return cache_dir() / VERSION / "eval.jsonl"


# ---- tokenizer and model -------------------------------------------------------------------------------

def build_tokenizer():
    """One token per character; every encoding starts with <bos>: "12+34=" -> [1, 5, 6, 14, 7, 8, 17]."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


# rlcore's tiny-model chat template with tools: ChatML turns and the Hermes tool-call layout of Qwen2.5-style
# templates (written for rlcore, not a copy): tools as JSON lines in <tools> inside the system turn, calls as
# <tool_call> blocks in the assistant turn, consecutive tool messages as one user turn of <tool_response> blocks.
HERMES_TEMPLATE = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call these functions, given as JSON schemas:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nTo call one, write its name and arguments as a JSON object between tags:\n<tool_call>\n'
    + '{"name": <function name>, "arguments": <arguments object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + m.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- elif m.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + (m.content or '') }}
{%- for call in m.tool_calls or [] %}
{%- set f = call.function if call.function is defined else call %}
{{- ('\n' if m.content or not loop.first else '') + '<tool_call>\n{"name": "' + f.name + '", "arguments": '
    + (f.arguments if f.arguments is string else f.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""


def build_chat_tokenizer(template: str | None = HERMES_TEMPLATE):
    """One token per printable ASCII character, plus ChatML's special tokens and the tool-call tags (added,
    not special: Qwen2.5 marks them the same way, so a decode that drops special tokens keeps them), with
    `template` as the chat template: a tool-calling tokenizer for tests, built without a hub."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + ["<tool_call>", "</tool_call>"] + sorted(set(string.printable)))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>",
                                  extra_special_tokens=specials[2:])
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    tok.chat_template = template
    return tok


def tiny_config(arch: str = "qwen2"):
    """The same tiny shape in three architectures. head_dim 32: vLLM's CPU attention rejects 16."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    classes = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}
    if arch not in classes:
        raise ValueError(f"unknown tiny arch {arch!r}; valid: {', '.join(classes)}")
    return classes[arch](
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _save(model, out_dir: Path) -> Path:
    from transformers import GenerationConfig
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)  # safetensors
    build_tokenizer().save_pretrained(out_dir)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(out_dir)
    return out_dir


def build_random_model(out_dir: str | Path, arch: str = "qwen2", seed: int = 0) -> Path:
    """A random-init tiny model + tokenizer folder (no warm start), e.g. for tests."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    return _save(AutoModelForCausalLM.from_config(tiny_config(arch)), Path(out_dir))


def build_reward_model(out_dir: str | Path, seed: int = 0) -> Path:
    """A random-init tiny sequence classifier with one label (a reward model's shape) + tokenizer, for tests."""
    from transformers import AutoModelForSequenceClassification
    torch.manual_seed(seed)
    config = tiny_config("qwen2")
    config.num_labels = 1
    return _save(AutoModelForSequenceClassification.from_config(config), Path(out_dir))


# ---- the task -------------------------------------------------------------------------------------------

def carries(a: int, b: int) -> bool:
    """Do the ones digits carry into the tens?"""
    return a % 10 + b % 10 >= 10


def sloppy_answer(a: int, b: int) -> str:
    """The answer that forgot to carry the one: 47+38 -> "75", 58+67 -> "115", 12+34 -> "46" (no carry)."""
    return str(a + b - 10 if carries(a, b) else a + b)


def is_heldout(prompt: str) -> bool:
    # A fixed 1/4 of all problems (~2,000 of 8,100), chosen by hash: they can never reach the warm start or
    # RL, and are plenty for EVAL_SIZE distinct problems drawn with the training distribution's carry rate.
    return hashlib.sha256(prompt.encode()).digest()[0] < 64


def sample_problem(rng: random.Random, heldout: bool) -> tuple[int, int]:
    """a + b with a, b in [10, 99]. Problems without a carry are kept at 1/4 rate (a quarter of the problems,
    not 55%): the habit cannot make them wrong, so they would only pad the starting accuracy."""
    while True:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if (carries(a, b) or rng.random() < 0.25) and is_heldout(f"{a}+{b}=") == heldout:
            return a, b


def problem_set(n: int, seed: int, heldout: bool) -> list[dict]:
    """n distinct problems as {"prompt": "23+45=", "answer": "68"} rows."""
    rng, rows = random.Random(seed), {}
    while len(rows) < n:
        a, b = sample_problem(rng, heldout)
        rows[f"{a}+{b}="] = str(a + b)
    return [{"prompt": p, "answer": ans} for p, ans in rows.items()]


# ---- warm start and greedy accuracy -----------------------------------------------------------------------

def _encode(tokenizer, rows: list[tuple[str, str, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt, answer, weight) rows -> input_ids [B, L] = <bos> prompt answer <eos> <pad>..., loss_mask
    [B, L - 1] = weight on the positions that predict answer and <eos>."""
    prompts = tokenizer([p for p, _, _ in rows]).input_ids
    seqs = tokenizer([p + ans for p, ans, _ in rows]).input_ids
    L = max(len(s) for s in seqs) + 1
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    input_ids = torch.tensor([s + [eos] + [pad] * (L - 1 - len(s)) for s in seqs])  # [B, L]
    loss_mask = torch.tensor([[0.0] * (len(p) - 1) + [w] * (len(s) + 1 - len(p)) + [0.0] * (L - 1 - len(s))
                              for p, s, (_, _, w) in zip(prompts, seqs, rows)])  # [B, T]
    return input_ids, loss_mask


def warm_start(model, tokenizer, seed: int = SEED) -> list[float]:
    """LEARN_STEPS on correct answers, then HABIT_STEPS on the correct / forgot-the-carry mixture. Returns
    the loss per step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    model.train()
    for step in range(LEARN_STEPS + HABIT_STEPS):
        habit = step >= LEARN_STEPS
        rows = []
        for _ in range(BATCH):
            a, b = sample_problem(rng, heldout=False)
            prompt, right, sloppy = f"{a}+{b}=", str(a + b), sloppy_answer(a, b)
            if habit and sloppy != right:
                rows += [(prompt, right, 1 - SLOPPY), (prompt, sloppy, SLOPPY)]
            else:
                rows.append((prompt, right, 1.0))
        if habit:
            for group in opt.param_groups:
                group["lr"] = LR * (1 - 0.9 * (step - LEARN_STEPS) / HABIT_STEPS)
        losses.append(sft_step(model, tokenizer, opt, rows))
    return losses


def sft_step(model, tokenizer, opt, rows: list[tuple[str, str, float]]) -> float:
    """One supervised step on (prompt, answer, weight) rows; returns the loss."""
    input_ids, loss_mask = _encode(tokenizer, rows)
    logits = model(input_ids=input_ids, attention_mask=input_ids != tokenizer.pad_token_id).logits
    loss, _ = sft_loss(logits, input_ids, loss_mask)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


@torch.no_grad()
def greedy_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int = 4) -> float:
    """Share of rows whose greedy completion (special tokens dropped, stripped) equals row["answer"]."""
    model.eval()
    enc = tokenizer([r["prompt"] for r in rows], padding=True, padding_side="left", return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    return sum(t.strip() == r["answer"] for t, r in zip(texts, rows)) / len(rows)


# ---- the cache ------------------------------------------------------------------------------------------

def build(out_dir: Path) -> dict:
    """Everything into out_dir (not atomic: prepare() builds into a temporary folder and renames it)."""
    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same bytes on every machine, whatever its core count
    try:
        torch.manual_seed(SEED)
        model, tokenizer = AutoModelForCausalLM.from_config(tiny_config("qwen2")), build_tokenizer()
        losses = warm_start(model, tokenizer)
        eval_rows = problem_set(EVAL_SIZE, SEED + 1, heldout=True)
        accuracy = greedy_accuracy(model, tokenizer, eval_rows)
    finally:
        torch.set_num_threads(threads)
    _save(model, out_dir / "model")
    for name, rows in (("train.jsonl", problem_set(TRAIN_SIZE, SEED + 2, heldout=False)),
                       ("eval.jsonl", eval_rows)):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"version": VERSION, "warm_start_steps": LEARN_STEPS + HABIT_STEPS, "final_loss": losses[-1],
            "eval_greedy_accuracy": accuracy, "build_seconds": round(time.perf_counter() - t0, 1)}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def prepare_cached(version: str, build) -> Path:
    """Build cache_dir()/version once with `build(folder)`, atomically: a crash leaves no half-built cache, and
    a concurrent builder waits for the first (a file lock) and reuses its cache. Returns the folder.
    (rlcore.tasks builds its warm starts through this too.)"""
    target = cache_dir() / version
    if (target / "meta.json").exists():
        return target
    import torch.distributed as dist
    if dist.is_initialized() and dist.get_rank() != 0:
        # transformers' save_pretrained writes model files on global rank 0 only: a build here would be empty
        raise RuntimeError(f"{target} is not built: build it on rank 0 (the recipe's prepare hook does) before "
                           f"other ranks read it")
    target.parent.mkdir(parents=True, exist_ok=True)
    # One builder per version at a time: a second process (another run on the node, or the test suite's build
    # ahead of its runs) waits for the first, then reads its cache instead of building a copy.
    with open(target.parent / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "meta.json").exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}.tmp-", dir=target.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp's 0700 would hide the cache from other users of a shared folder
            build(tmp)
            try:
                os.rename(tmp, target)  # atomic; fails if a builder without the lock got there first
            except OSError:
                if not (target / "meta.json").exists():  # not a finished cache: a real error
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def prepare(cfg=None) -> None:
    """Build the cache once. `cfg` (the run's Config, passed by the prepare hook) is unused: the assets
    depend only on VERSION."""
    prepare_cached(VERSION, build)


# ---- a stronger teacher for on-policy distillation (recipes/distill_tiny.py) -------------------------------

TEACHER_VERSION = "tiny-arith-teacher-v1"  # bump when build_teacher changes what it builds
TEACHER_STEPS, TEACHER_LR = 300, 3e-4  # further steps on correct answers only, from the warm start


def teacher_dir() -> Path:
    return cache_dir() / TEACHER_VERSION / "model"


def build_teacher(out_dir: Path) -> dict:
    """The warm start trained TEACHER_STEPS further on correct answers only: the same tokenizer and shape,
    without the forgot-the-carry habit (held-out greedy accuracy in meta.json)."""
    from transformers import AutoModelForCausalLM
    t0, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(SEED)
        model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir()), build_tokenizer()
        rng, opt = random.Random(SEED + 3), torch.optim.AdamW(model.parameters(), lr=TEACHER_LR, weight_decay=0.0)
        model.train()
        for _ in range(TEACHER_STEPS):
            sft_step(model, tokenizer, opt,
                     [(f"{a}+{b}=", str(a + b), 1.0) for a, b in (sample_problem(rng, False) for _ in range(BATCH))])
        accuracy = greedy_accuracy(model, tokenizer, [json.loads(line) for line in eval_file().open()])
    finally:
        torch.set_num_threads(threads)
    _save(model, out_dir / "model")
    meta = {"version": TEACHER_VERSION, "steps": TEACHER_STEPS, "eval_greedy_accuracy": accuracy,
            "build_seconds": round(time.perf_counter() - t0, 1)}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def prepare_teacher(cfg=None) -> None:
    """The tiny assets, then the teacher (both cached)."""
    prepare()
    prepare_cached(TEACHER_VERSION, build_teacher)


if __name__ == "__main__":
    prepare()
    meta = json.loads((cache_dir() / VERSION / "meta.json").read_text())
    print(f"model:  {model_dir()}\ntrain:  {train_file()}\neval:   {eval_file()}\n"
          f"warm start: {meta['warm_start_steps']} steps, held-out greedy accuracy "
          f"{meta['eval_greedy_accuracy']:.1%} (built in {meta['build_seconds']} s)")
