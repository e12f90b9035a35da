"""Research harness: can on-policy distillation move a task skill into a tiny student?

A record of the recipe search behind issue 14, not part of the package and not a benchmark.
Standalone (torch and transformers only) so it runs as is on the GPU machine; it re-implements
the embedded default's two tasks (calculator, lookup), their ideal transcripts (token-identical
to ``dressage.tiny.teachers.teacher_transcripts``: checked on the first instances) and a
two-turn tool agent, plus auxiliary tool tasks (length, reverse, double) for a "generalist"
base model. One run: pre-train the base on the auxiliary tasks, fine-tune one teacher per task
from it, make students (the base plus K steps of supervised training on both tasks), then run
on-policy distillation from each student with either objective:

- sampled-token (the project's MOPD loss): ``A_t = clip(log pT(y_t) - log pS(y_t), -5, 5)``,
  loss ``-A_t log pS(y_t)``, token mean per sample;
- dense: the exact reverse KL over the vocabulary at every position of the student's samples.

Accuracy is greedy, through the two-turn loop with the task's own tool only. Run from a folder
that holds ``tok/`` (the task vocabulary's tokenizer folder,
``dressage.tiny.task_tokenizer.task_tokenizer_dir()``)::

    python mopd_recipe.py '{"rand_tools": true, "hidden": 128, "base_lr": 5e-3,
        "base_steps": 1000, "teacher_steps": 1000, "teacher_lr": 1e-2, "student_steps": [40],
        "mopd": [{"student": 40, "dense": true, "lr": 2e-3, "steps": 100}]}'

Logs and the findings: ``bench/results/mopd_recipe/``.
"""

import copy
import json
import math
import os
import random
import re
import sys
import time

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

DEV = "cuda" if torch.cuda.is_available() else "cpu"
HERE = os.path.dirname(os.path.abspath(__file__))
tok = AutoTokenizer.from_pretrained(
    os.environ.get("MOPD_RECIPE_TOKENIZER", os.path.join(HERE, "tok"))
)
IM_END = tok.convert_tokens_to_ids("<|im_end|>")
PAD = tok.convert_tokens_to_ids("<|endoftext|>")
SYS = (
    "You are a careful assistant. Use a tool when one helps, then reply with the final answer only."
)
FRUITS = (
    "apple",
    "fig",
    "grape",
    "kiwi",
    "lemon",
    "mango",
    "melon",
    "olive",
    "peach",
    "pear",
    "plum",
)
SUFFIX = "Reply with the number only."


def spec(name, param, desc):
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {param: {"type": "string"}},
                "required": [param],
            },
        },
    }


TOOLS = {
    "calculator": spec(
        "calculator",
        "expression",
        "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
    ),
    "lookup": spec("lookup", "key", "Return the value stored under a key of the task's table."),
    "length": spec("length", "word", "Return the number of letters of a word."),
    "reverse": spec("reverse", "number", "Return the digits of a number in reverse order."),
    "double": spec("double", "number", "Return twice a number."),
    "echo": spec("echo", "code", "Return the check number of a code."),
}


def fmt(v):
    return str(int(v)) if float(v).is_integer() else f"{v:.6g}"


NAMES = [
    "helper",
    "tool",
    "compute",
    "worker",
    "engine",
    "oracle",
    "service",
    "agent",
    "runner",
    "probe",
    "finder",
    "solver",
]
PARAMS = ["text", "input", "value", "query", "arg", "data"]
RAND_TOOLS = False
PER_TASK = {}


def make(task, rng):
    inst = _make(task, rng)
    if RAND_TOOLS and task not in ("calculator", "lookup"):
        inst["tool"] = rng.choice(NAMES)
        inst["param"] = rng.choice(PARAMS)
    inst["spec"] = spec(inst["tool"], inst["param"], TOOLS[task]["function"]["description"])
    return inst


def _make(task, rng):
    if task == "calculator":
        op = rng.choice("+-*")
        a = rng.randint(2, 60)
        b = rng.randint(2, 25) if op == "*" else rng.randint(2, 30)
        e = f"{a} {op} {b}"
        return dict(
            task=task,
            prompt=f"Compute {e}. {SUFFIX}",
            tool="calculator",
            param="expression",
            value=e,
            label=fmt(eval(e)),
        )
    if task == "lookup":
        keys = rng.sample(FRUITS, 4)
        vals = [rng.randint(1, 99) for _ in keys]
        i = rng.randrange(4)
        table = ", ".join(f"{k}={v}" for k, v in zip(keys, vals, strict=False))
        return dict(
            task=task,
            prompt=f"Table: {table}. What is the value of {keys[i]}? {SUFFIX}",
            tool="lookup",
            param="key",
            value=keys[i],
            label=str(vals[i]),
        )
    if task == "length":
        w = rng.choice(FRUITS)
        return dict(
            task=task,
            prompt=f"How many letters are in the word {w}? {SUFFIX}",
            tool="length",
            param="word",
            value=w,
            label=str(len(w)),
        )
    if task == "reverse":
        n = str(rng.randint(10, 9999))
        return dict(
            task=task,
            prompt=f"Reverse the digits of {n}. {SUFFIX}",
            tool="reverse",
            param="number",
            value=n,
            label=n[::-1],
        )
    if task == "double":
        n = rng.randint(2, 499)
        return dict(
            task=task,
            prompt=f"Double the number {n}. {SUFFIX}",
            tool="double",
            param="number",
            value=str(n),
            label=str(2 * n),
        )
    if task == "echo":  # copy a span of digits, symbols and words: the operator-copying move
        items = [str(rng.randint(1, 99)) for _ in range(3)]
        parts = [items[0]]
        for item in items[1 : rng.randint(2, 3)]:
            parts += [rng.choice(ECHO_SYMBOLS), item]
        code = " ".join(parts)
        return dict(
            task=task,
            prompt=f"Send the code {code} to the tool. {SUFFIX}",
            tool="echo",
            param="code",
            value=code,
            label=_check_number(code),
        )
    raise ValueError(task)


ECHO_SYMBOLS = ("+", "-", "*", "/", "%", "=", "<", ">", "&", "^", "and", "or", "to", "of")


def _check_number(code):
    return str(sum((i + 1) * ord(c) for i, c in enumerate(code)) % 997)


def run_tool(inst, name, param, value):
    """The environment of inst's task: only its own tool exists."""
    if name != inst["tool"]:
        return f"error: unknown tool {name!r}; available: ['{inst['tool']}']"
    if param != inst["param"]:
        return f"error: missing argument {inst['param']!r}"
    t = inst["task"]
    try:
        if not value.strip():
            raise ValueError("empty")
        if t == "calculator":
            if not re.fullmatch(r"[0-9+\-*/(). ]+", value):
                raise ValueError("bad")
            return fmt(eval(value))
        if t == "lookup":
            table = dict(
                kv.split("=")
                for kv in re.search(r"Table: (.*?)\. What", inst["prompt"]).group(1).split(", ")
            )
            k = value.strip().lower()
            return (
                table[k]
                if k in table
                else f"error: no key {k!r} in the table; keys: {sorted(table)}"
            )
        if t == "length":
            return str(len(value.strip()))
        if t == "reverse":
            return value.strip()[::-1]
        if t == "double":
            return str(2 * int(value))
        if t == "echo":
            return _check_number(value.strip())
    except Exception as exc:
        return f"error: {type(exc).__name__}"


PROMPT_CACHE = {}


def prompt_ids(inst):
    key = (inst["task"], inst["prompt"], inst["tool"], inst["param"])
    if key not in PROMPT_CACHE:
        msgs = [{"role": "system", "content": SYS}, {"role": "user", "content": inst["prompt"]}]
        PROMPT_CACHE[key] = tok.apply_chat_template(
            msgs,
            tools=[inst["spec"]],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=False,
        )
    return tok.encode(PROMPT_CACHE[key], add_special_tokens=False)


def call_text(name, param, value):
    return (
        f"<tool_call>\n<function={name}>\n<parameter={param}>\n{value}\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>"
    )


def resp_text(result):
    return (
        f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def enc(s):
    return tok.encode(s, add_special_tokens=False)


def transcript(inst):
    p = prompt_ids(inst)
    c = enc(call_text(inst["tool"], inst["param"], inst["value"]))
    r = enc(resp_text(inst["label"]))
    a = enc(inst["label"] + "<|im_end|>")
    ids = p + c + r + a
    mask = [0] * len(p) + [1] * len(c) + [0] * len(r) + [1] * len(a)
    return ids, mask


CALL_RE = re.compile(r"<function=([^>\n]*)>\s*<parameter=([^>\n]*)>\n(.*?)\n</parameter>", re.S)


def parse_call(text):
    m = CALL_RE.search(text)
    return (m.group(1), m.group(2), m.group(3)) if m else None


def new_model(seed, hidden=64, layers=2, inter=None, heads=4, kv=2):
    cfg = Qwen3Config(
        vocab_size=704,
        hidden_size=hidden,
        intermediate_size=inter or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hidden // heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=IM_END,
        pad_token_id=PAD,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).to(DEV)


def pad_batch(seqs, left=False, value=PAD):
    L = max(len(s) for s in seqs)
    out = torch.full((len(seqs), L), value, dtype=torch.long)
    att = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        if left:
            out[i, L - len(s) :] = torch.tensor(s)
            att[i, L - len(s) :] = 1
        else:
            out[i, : len(s)] = torch.tensor(s)
            att[i, : len(s)] = 1
    return out.to(DEV), att.to(DEV)


def token_logprobs(model, seqs, masks, grad=False):
    """Per-sequence list of log-probs of masked tokens."""
    ids, att = pad_batch(seqs)
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        logits = model(input_ids=ids, attention_mask=att).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    m = pad_batch(masks, value=0)[0][:, 1:].float()
    return lp, m


def sft(model, data, steps, bs=32, lr=1e-2, warm=30, seed=0, log_every=0, evalf=None):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )
    g = random.Random(seed)
    hist = []
    model.train()
    for s in range(steps):
        b = [data[g.randrange(len(data))] for _ in range(bs)]
        lp, m = token_logprobs(model, [x[0] for x in b], [x[1] for x in b], grad=True)
        loss = -(lp * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log_every and (s + 1) % log_every == 0 and evalf:
            model.eval()
            hist.append((s + 1, float(loss.detach()), evalf(model)))
            model.train()
    model.eval()
    return hist


@torch.no_grad()
def generate(model, prompts, greedy, max_new=40, temperature=1.0):
    ids, att = pad_batch(prompts, left=True)
    out = model.generate(
        input_ids=ids,
        attention_mask=att,
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_k=0 if not greedy else None,
        top_p=1.0 if not greedy else None,
        max_new_tokens=max_new,
        eos_token_id=IM_END,
        pad_token_id=PAD,
    )
    res = []
    for row in out[:, ids.shape[1] :].tolist():
        if IM_END in row:
            row = row[: row.index(IM_END) + 1]
        else:
            row = [t for t in row if t != PAD]
        res.append(row)
    return res


def rollout(model, insts, greedy, max_new=40):
    """Two-turn agent runs. Returns list of dict(seq, mask, correct)."""
    p1 = [prompt_ids(i) for i in insts]
    o1 = generate(model, p1, greedy, max_new)
    ctx2, results = [], []
    for i, (inst, o) in enumerate(zip(insts, o1, strict=False)):
        call = parse_call(tok.decode(o)) if (o and o[-1] == IM_END) else None
        result = run_tool(inst, *call) if call else None
        results.append(result)
        if result is not None:
            ctx2.append(p1[i] + o + enc(resp_text(result)))
    o2 = iter(generate(model, ctx2, greedy, max_new)) if ctx2 else iter([])
    runs = []
    for i, (inst, o) in enumerate(zip(insts, o1, strict=False)):
        if results[i] is None:
            runs.append(dict(seq=p1[i] + o, mask=[0] * len(p1[i]) + [1] * len(o), correct=False))
            continue
        r = enc(resp_text(results[i]))
        a = next(o2)
        ans = tok.decode([t for t in a if t != IM_END]).strip()
        runs.append(
            dict(
                seq=p1[i] + o + r + a,
                mask=[0] * len(p1[i]) + [1] * len(o) + [0] * len(r) + [1] * len(a),
                correct=(ans == inst["label"] and bool(a) and a[-1] == IM_END),
            )
        )
    return runs


def accuracy(model, insts, bs=128):
    ok = 0
    for s in range(0, len(insts), bs):
        ok += sum(r["correct"] for r in rollout(model, insts[s : s + bs], greedy=True))
    return ok / len(insts)


def topk_reverse_kl(ls, tl, k):
    """Reverse KL over the student's top-k tokens plus one bucket for the rest of the vocabulary.

    Needs only the teacher's log-probs at the student's k ids (and their sum): what a
    vocab-parallel trainer can gather. Exact KL of the coarsened distributions, so >= 0 and
    <= the full reverse KL.
    """
    top = ls.detach().topk(k, dim=-1).indices
    s_lp = ls.gather(-1, top)
    t_lp = tl.gather(-1, top)
    s_p = s_lp.exp()
    head = (s_p * (s_lp - t_lp)).sum(-1)
    s_rest = (1 - s_p.sum(-1)).clamp(min=1e-6)
    t_rest = (1 - t_lp.exp().sum(-1)).clamp(min=1e-6)
    return head + s_rest * (s_rest.log() - t_rest.log())


def mopd(
    student,
    teachers,
    route,
    train_insts,
    eval_sets,
    steps,
    per_task=8,
    lr=1e-3,
    clip=5.0,
    seed=0,
    eval_every=10,
    inner=1,
    dense=False,
    topk=0,
):
    opt = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    g = random.Random(seed)
    torch.manual_seed(seed)
    curve = [(0, {t: accuracy(student, v) for t, v in eval_sets.items()}, {})]
    for step in range(1, steps + 1):
        batch = [
            inst
            for t in train_insts
            for inst in g.sample(train_insts[t], PER_TASK.get(t, per_task))
        ]
        runs = rollout(student, batch, greedy=False)
        seqs, masks = [r["seq"] for r in runs], [r["mask"] for r in runs]
        by_teacher = {}
        for k, inst in enumerate(batch):
            by_teacher.setdefault(route[inst["task"]], []).append(k)
        tlp = [None] * len(batch)
        for tid, ks in by_teacher.items():
            lp, m = token_logprobs(teachers[tid], [seqs[k] for k in ks], [masks[k] for k in ks])
            for j, k in enumerate(ks):
                tlp[k] = lp[j]
        slp_old, m = token_logprobs(student, seqs, masks)
        L = slp_old.shape[1]
        T = torch.stack([F.pad(x, (0, L - x.shape[0])) for x in tlp])
        adv = (T - slp_old).clamp(-clip, clip) * m
        kl = {}
        for t in train_insts:
            ks = [k for k, inst in enumerate(batch) if inst["task"] == t]
            kl[t] = float(((slp_old[ks] - T[ks]) * m[ks]).sum() / m[ks].sum())
        if dense or topk:
            tl = [None] * len(batch)
            for tid, ks in by_teacher.items():
                ids_t, att_t = pad_batch([seqs[k] for k in ks])
                with torch.no_grad():
                    lg = torch.log_softmax(
                        teachers[tid](input_ids=ids_t, attention_mask=att_t).logits.float()[:, :-1],
                        -1,
                    )
                for j, k in enumerate(ks):
                    tl[k] = lg[j]
            TL = torch.stack([F.pad(x, (0, 0, 0, L - x.shape[0])) for x in tl])
            ids_s, att_s = pad_batch(seqs)
            for _ in range(inner):
                ls = torch.log_softmax(
                    student(input_ids=ids_s, attention_mask=att_s).logits.float()[:, :-1], -1
                )
                if topk:
                    kl_tok = topk_reverse_kl(ls, TL, topk)
                else:
                    kl_tok = (ls.exp() * (ls - TL)).sum(-1)
                per = (kl_tok * m).sum(1) / m.sum(1).clamp(min=1)
                loss = per.mean()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
                opt.step()
        for _ in range(0 if (dense or topk) else inner):
            slp, _ = token_logprobs(student, seqs, masks, grad=True)
            # token-mean per sample, mean over samples
            per = (-(adv * slp) * m).sum(1) / m.sum(1).clamp(min=1)
            loss = per.mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
            opt.step()
        if step % eval_every == 0 or step == steps:
            curve.append((step, {t: accuracy(student, v) for t, v in eval_sets.items()}, kl))
            rounded = {k: round(v, 3) for k, v in kl.items()}
            print(
                f"    step {step} acc {curve[-1][1]} kl {rounded}",
                flush=True,
            )
    return curve


def insts(task, n, seed):
    rng = random.Random(f"{task}:{seed}")
    return [make(task, rng) for _ in range(n)]


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    RAND_TOOLS = cfg.get("rand_tools", False)
    t0 = time.time()
    hidden = cfg.get("hidden", 64)
    layers = cfg.get("layers", 2)
    aux = cfg.get("aux", ["length", "reverse", "double"])
    evals = {t: insts(t, 128, 10_000) for t in ["calculator", "lookup", *aux]}
    data = {
        t: [transcript(i) for i in insts(t, cfg.get("n_train", 8192), 0)]
        for t in ["calculator", "lookup", *aux]
    }
    print(
        f"data ready {time.time() - t0:.1f}s; tokens/transcript "
        f"{sum(len(x[0]) for x in data['calculator'][:100]) / 100:.0f}",
        flush=True,
    )

    def ev(m, ts=("calculator", "lookup", *aux)):
        out = {t: round(accuracy(m, evals[t][:64]), 3) for t in ts}
        if "calculator" in ts and cfg.get("per_op"):  # which operations the model solves
            for op in "+-*":
                picked = [i for i in evals["calculator"] if f" {op} " in i["value"]][:32]
                out["calc" + op] = round(accuracy(m, picked), 3)
        return out

    # 1. base: aux pretraining
    if cfg.get("base_from"):
        base = Qwen3ForCausalLM.from_pretrained(cfg["base_from"], dtype=torch.float32).to(DEV)
        cfg["base_steps"] = 0
    else:
        base = new_model(
            cfg.get("seed", 0), hidden, layers, heads=cfg.get("heads", 4), kv=cfg.get("kv", 2)
        )
    auxdata = [x for t in aux for x in data[t]]
    t1 = time.time()
    hist = (
        []
        if not cfg.get("base_steps", 1500)
        else sft(
            base,
            auxdata,
            cfg.get("base_steps", 1500),
            bs=32,
            lr=cfg.get("base_lr", 1e-2),
            seed=1,
            log_every=250,
            evalf=ev,
        )
    )
    for h in hist:
        print("  base", h, flush=True)
    print(f"base done {time.time() - t1:.1f}s", flush=True)
    # 2. teachers
    teachers = {}
    for task in ["calculator", "lookup"]:
        t1 = time.time()
        tm = copy.deepcopy(base)
        hist = sft(
            tm,
            data[task],
            cfg.get("teacher_steps_" + task, cfg.get("teacher_steps", 300)),
            bs=32,
            lr=cfg.get("teacher_lr_" + task, cfg.get("teacher_lr", 3e-3)),
            warm=10,
            seed=2,
            log_every=cfg.get("teacher_log_every", 100),
            evalf=lambda m: ev(m, ("calculator", "lookup")),
        )
        for h in hist:
            print(f"  teacher {task}", h, flush=True)
        print(f"teacher {task} done {time.time() - t1:.1f}s", flush=True)
        teachers[task] = tm
    # 3. students: base + light SFT on the mixture
    train_insts = {t: insts(t, 512, 1) for t in ["calculator", "lookup"]}
    eval_sets = {t: evals[t] for t in ["calculator", "lookup"]}
    mix = [x for pair in zip(data["calculator"], data["lookup"], strict=False) for x in pair]
    students = {}
    for k in cfg.get("student_steps", [0, 15, 40]):
        st = copy.deepcopy(base)
        if k:
            sft(
                st,
                mix,
                k,
                bs=cfg.get("student_bs", 8),
                lr=cfg.get("student_lr", 3e-3),
                warm=1,
                seed=3,
            )
        students[k] = st
        print(f"student K={k}: {ev(st, ('calculator', 'lookup'))}", flush=True)
    for var in cfg.get("mopd", [{}]):
        t1 = time.time()
        route = var.get("route", {"calculator": "calculator", "lookup": "lookup"})
        st = copy.deepcopy(students[var.get("student", 15)])
        PER_TASK.clear()
        PER_TASK.update(var.get("per_task_map", {}))
        print(f"MOPD {var}", flush=True)
        curve = mopd(
            st,
            teachers,
            route,
            train_insts,
            eval_sets,
            var.get("steps", 60),
            per_task=var.get("per_task", 8),
            lr=var.get("lr", 1e-3),
            seed=var.get("seed", 0),
            eval_every=var.get("eval_every", 10),
            inner=var.get("inner", 1),
            dense=var.get("dense", False),
            topk=var.get("topk", 0),
        )
        print(f"  MOPD done {time.time() - t1:.1f}s final {curve[-1][1]}", flush=True)
    print(f"total {time.time() - t0:.1f}s")
