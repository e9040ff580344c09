#!/usr/bin/env python3
"""Train an EAGLE draft head for a GGUF target by self-distillation.

    eagle_train.py --target models/stories260K.gguf -o models/stories260K-eagle.gguf
    eagle_train.py --target T.gguf --data seqs.jsonl -o H.gguf    (tools/eagle_data.py)

What it does, as the EAGLE authors train theirs, on data the target writes
itself (no data set needed):

1. Loads the target's weights from the GGUF (dequantized to float32 with the
   gguf package) into a small PyTorch llama / qwen2 forward pass with a KV
   cache (qwen2: q/k/v biases, NEOX RoPE, the RoPE base and the tied LM head
   from the file). The token sequences either come from --data (JSON lines of
   ids with the prompt length, e.g. chat answers cairn wrote: far faster than
   generating in PyTorch for a real model), or it generates --n-seqs
   sequences of --seq-len tokens from BOS: each sampled at a temperature
   drawn from --temps, a share of them switching to greedy decoding after a
   sampled opening, so the head sees the target's greedy continuations too
   (what it drafts for at temperature 0).
2. Runs the target over the sequences once and records, for every position
   j, its feature f_j (final hidden state after the output norm). With --data
   it also checks, on the first answers, that its argmax is the answer's next
   token (so this forward pass is the target's).
3. Trains the head: row j reads [embed(x_{j+1}) ; f_j] and must predict
   f_{j+1}. Loss = smooth-L1(pred, f_{j+1}) (in units of the mean |f|) +
   w_cls * cross-entropy between the target's distribution at j+1,
   softmax(lm_head(f_{j+1})), and lm_head(pred). The embedding and LM head
   are the target's, frozen. For a large vocabulary the cross-entropy runs
   over the tokens that occur in the data (--cls-vocab). Rows inside a --data
   prompt weigh --prompt-weight (the head drafts answers, but reads prompts).
   Drafting feeds the head its own predictions beyond the first level, so the
   training is unrolled --unroll steps ("training-time test"): step s row j
   reads [embed(x_{j+s}) ; its own step s-1 output] and attends, exactly as
   a draft tree row does, to the step-1 rows 0..j (true features) and to its
   own earlier steps. Later steps are weighted by --unroll-decay. The epoch
   with the lowest validation loss (last 10 % of the sequences) is kept.
4. Writes the head with tools/eagle_convert.py's write_head().

With --kind medusa it trains Medusa heads instead (model/model.h, "Medusa
heads") on the same data and features: head k (0-based) reads f_j and must
predict token j+k+2, the loss being the cross-entropy between the target's
distribution at j+k+1 and the head's, weighted --medusa-decay^k. Each head
starts as the published code starts one: residual blocks at zero weight, its
LM head a copy of the target's (or, with --medusa-share-lm, the target's
frozen one, which the file then leaves out). It reports the greedy tau the
heads reach on the validation sequences' greedy stretches with cairn's draft
tree (best paths by summed log-probability, top_k halved per level), and
writes them with eagle_convert.py's write_medusa().

torch (CPU) is needed here only; cairn's tests use the head this writes.
Everything is seeded: the same command gives the same head on one machine.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.stderr.write("eagle_train.py needs PyTorch: pip install torch\n")
    sys.exit(2)
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eagle_convert import (target_info, write_head, write_medusa, write_eagle3,  # noqa: E402
                           default_eagle3_layers)


# ---- the target --------------------------------------------------------------

def load_target(path):
    info = target_info(path)
    if info["arch"] not in ("llama", "qwen2"):
        raise SystemExit("eagle_train.py: architecture %s not supported" % info["arch"])
    r = gguf.GGUFReader(path)
    w = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = [int(x) for x in reversed(t.shape)] if len(t.shape) > 1 else [int(t.shape[0])]
        w[t.name] = torch.from_numpy(np.array(a, dtype=np.float32).reshape(shape))
    if "output.weight" not in w:
        w["output.weight"] = w["token_embd.weight"]
    info["head_dim"] = info["dim"] // info["n_head"]
    return info, w


def rope_tables(info, max_pos):
    n_rot, hd = info["n_rot"], info["head_dim"]
    inv = info["rope_base"] ** (-torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float(), n_rot, hd


def apply_rope(x, pos, tables, neox):
    """x [..., T, H, hd]; pos [T]. NORMAL: pairs (2i, 2i+1); NEOX: (i, i+n/2)."""
    cos, sin, n_rot, hd = tables
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    r, rest = x[..., :n_rot], x[..., n_rot:]
    if neox:
        a, b = r[..., : n_rot // 2], r[..., n_rot // 2:]
        out = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    else:
        a, b = r[..., 0::2], r[..., 1::2]
        out = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([out, rest], dim=-1)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Target:
    def __init__(self, info, w, max_pos):
        self.i, self.w = info, w
        self.tables = rope_tables(info, max_pos)
        self.neox = info["arch"] == "qwen2"

    def forward(self, tokens, cache=None, start=0, logits=True, states=None):
        """tokens [B, T] -> (features [B, T, dim] after the output norm,
        logits [B, T, V] or None). cache: list of (K, V) per layer, extended
        in place. states, a dict {layer: None}, receives the residual stream
        entering each of its layers (EAGLE-3's low/mid/high states)."""
        i, w = self.i, self.w
        B, T = tokens.shape
        hd, nh, nkv = i["head_dim"], i["n_head"], i["n_kv_head"]
        pos = torch.arange(start, start + T)
        x = w["token_embd.weight"][tokens]
        for l in range(i["n_layer"]):
            if states is not None and l in states:
                states[l] = x
            p = "blk.%d." % l
            h = rmsnorm(x, w[p + "attn_norm.weight"], i["eps"])
            q = h @ w[p + "attn_q.weight"].T
            k = h @ w[p + "attn_k.weight"].T
            v = h @ w[p + "attn_v.weight"].T
            for name, t in (("attn_q.bias", "q"), ("attn_k.bias", "k"), ("attn_v.bias", "v")):
                if p + name in w:
                    if t == "q":
                        q = q + w[p + name]
                    elif t == "k":
                        k = k + w[p + name]
                    else:
                        v = v + w[p + name]
            q = apply_rope(q.view(B, T, nh, hd), pos, self.tables, self.neox)
            k = apply_rope(k.view(B, T, nkv, hd), pos, self.tables, self.neox)
            v = v.view(B, T, nkv, hd)
            if cache is not None:
                if len(cache) <= l:
                    cache.append((k, v))
                else:
                    k = torch.cat([cache[l][0], k], dim=1)
                    v = torch.cat([cache[l][1], v], dim=1)
                    cache[l] = (k, v)
            rep = nh // nkv
            qh = q.transpose(1, 2)
            kh = k.repeat_interleave(rep, dim=2).transpose(1, 2)
            vh = v.repeat_interleave(rep, dim=2).transpose(1, 2)
            a = F.scaled_dot_product_attention(qh, kh, vh, is_causal=T > 1 and start == 0)
            x = x + a.transpose(1, 2).reshape(B, T, nh * hd) @ w[p + "attn_output.weight"].T
            h = rmsnorm(x, w[p + "ffn_norm.weight"], i["eps"])
            g = F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
            x = x + g @ w[p + "ffn_down.weight"].T
        f = rmsnorm(x, w["output_norm.weight"], i["eps"])
        return f, (f @ w["output.weight"].T if logits else None)


@torch.no_grad()
def generate(target, n_seqs, seq_len, temps, greedy_share, bos, gen):
    """Token sequences [n_seqs, seq_len] written by the target, and per
    sequence the position j from which token j+1 on is greedy (seq_len:
    none)."""
    B = n_seqs
    toks = torch.full((B, 1), bos, dtype=torch.long)
    temp = torch.tensor([temps[j % len(temps)] for j in range(B)], dtype=torch.float32)
    # a share of the sequences turns greedy after an opening of 4..32 tokens
    switch = torch.randint(4, 33, (B,), generator=gen)
    greedy = torch.rand(B, generator=gen) < greedy_share
    cache = []
    _, logits = target.forward(toks, cache, 0)
    for t in range(1, seq_len):
        lg = logits[:, -1, :]
        probs = torch.softmax(lg / temp[:, None], dim=-1)
        sampled = torch.multinomial(probs, 1, generator=gen)[:, 0]
        top = lg.argmax(-1)
        use_greedy = greedy & (t >= switch)
        nxt = torch.where(use_greedy, top, sampled)
        toks = torch.cat([toks, nxt[:, None]], dim=1)
        _, logits = target.forward(nxt[:, None], cache, t)
    greedy_from = torch.where(greedy, switch - 1, torch.full_like(switch, seq_len))
    return toks, greedy_from


# ---- the head ------------------------------------------------------------------

class Head(torch.nn.Module):
    def __init__(self, info, ffn, tables, neox):
        super().__init__()
        d = info["dim"]
        self.i, self.tables, self.neox = info, tables, neox
        hd, nh, nkv = info["head_dim"], info["n_head"], info["n_kv_head"]
        self.fc = torch.nn.Linear(2 * d, d, bias=True)
        self.q = torch.nn.Linear(d, nh * hd, bias=False)
        self.k = torch.nn.Linear(d, nkv * hd, bias=False)
        self.v = torch.nn.Linear(d, nkv * hd, bias=False)
        self.o = torch.nn.Linear(nh * hd, d, bias=False)
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.gate = torch.nn.Linear(d, ffn, bias=False)
        self.up = torch.nn.Linear(d, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, d, bias=False)

    def qkv(self, x, pos):
        B, T, _ = x.shape
        i = self.i
        hd = i["head_dim"]
        q = apply_rope(self.q(x).view(B, T, i["n_head"], hd), pos, self.tables, self.neox)
        k = apply_rope(self.k(x).view(B, T, i["n_kv_head"], hd), pos, self.tables, self.neox)
        v = self.v(x).view(B, T, i["n_kv_head"], hd)
        rep = i["n_head"] // i["n_kv_head"]
        return (q.transpose(1, 2), k.repeat_interleave(rep, 2).transpose(1, 2),
                v.repeat_interleave(rep, 2).transpose(1, 2))

    def finish(self, x, a):
        B, T, _ = x.shape
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        h = rmsnorm(x, self.ffn_norm, self.i["eps"])
        return x + self.down(F.silu(self.gate(h)) * self.up(h))

    def unrolled(self, emb, feat, steps):
        """emb [B, T, d] = embed(x_{j+1}) for rows j = 0..T-1 (the caller
        aligns them); feat [B, T, d] = f_j. Returns the outputs of each step s
        (1-based): rows j predict f_{j+s}, read embed(x_{j+s})."""
        B, T, d = feat.shape
        pos = torch.arange(T)
        outs = []
        K1 = V1 = None
        selfs = []  # (k, v) of earlier unrolled steps, per row
        cur_feat = feat
        scale = 1.0 / math.sqrt(self.i["head_dim"])
        for s in range(steps):
            n = T - s  # rows with a token x_{j+s+1} available
            x = self.fc(torch.cat([emb[:, s:s + n], cur_feat[:, :n]], dim=-1))
            q, k, v = self.qkv(x, pos[s:s + n] if s == 0 else pos[:n] + s)
            if s == 0:
                K1, V1 = k, v
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                # chain r (root = step-1 row r): the committed rows 0..r of
                # step 1, then this chain's rows of the earlier steps, itself
                sc = (q @ K1.transpose(-1, -2)) * scale           # [B,H,n,T]
                mask = torch.ones(n, T, dtype=torch.bool).tril(diagonal=0)
                sc = sc.masked_fill(~mask, float("-inf"))
                extra = [((q * kk[:, :, :n]).sum(-1, keepdim=True) * scale, vv[:, :, :n])
                         for kk, vv in selfs]
                extra.append(((q * k).sum(-1, keepdim=True) * scale, v))
                allsc = torch.cat([sc] + [e[0] for e in extra], dim=-1)
                p = torch.softmax(allsc, dim=-1)
                a = p[..., :T] @ V1
                for idx, (_, vv) in enumerate(extra):
                    a = a + p[..., T + idx:T + idx + 1] * vv
            out = self.finish(x, a)
            outs.append(out)
            if s > 0:
                selfs.append((k, v))
            else:
                selfs = []
            cur_feat = out
        return outs


def read_data(path):
    """Sequences from a JSON-lines file (tools/eagle_data.py writes one):
    {"ids": [...], "prompt_len": P}; returns [(LongTensor ids, P)]."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out.append((torch.tensor(r["ids"], dtype=torch.long), int(r.get("prompt_len", 1))))
    return out


@torch.no_grad()
def record_features(target, seqs, check_greedy):
    """The target's feature f_j for every position of every sequence, one
    sequence per forward (they differ in length). For the first
    `check_greedy` sequences also compares the target's argmax with the
    next token in the answer: on greedy answers written by cairn it must
    agree nearly everywhere, or this forward pass is not the target's."""
    feats, agree, total = [], 0, 0
    for k, (ids, plen) in enumerate(seqs):
        f, lg = target.forward(ids[None], logits=k < check_greedy)
        feats.append(f[0])
        if lg is not None:
            pred = lg[0, plen - 1:-1].argmax(-1)
            agree += int((pred == ids[plen:]).sum())
            total += len(ids) - plen
    return feats, (agree / total if total else None)


# ---- EAGLE-3 heads ---------------------------------------------------------------

class Eagle3Head(torch.nn.Module):
    """model/model.h, "EAGLE-3 heads": fc over three target states, one layer
    over [normed embedding ; normed feature], its own norm and LM head (here
    over the full vocabulary, so d2t is all zeros)."""

    def __init__(self, info, ffn, tables, neox, lm):
        super().__init__()
        d = info["dim"]
        self.i, self.tables, self.neox = info, tables, neox
        hd, nh, nkv = info["head_dim"], info["n_head"], info["n_kv_head"]
        self.fc = torch.nn.Linear(3 * d, d, bias=False)
        self.in_norm = torch.nn.Parameter(torch.ones(d))
        self.hidden_norm = torch.nn.Parameter(torch.ones(d))
        self.q = torch.nn.Linear(2 * d, nh * hd, bias=False)
        self.k = torch.nn.Linear(2 * d, nkv * hd, bias=False)
        self.v = torch.nn.Linear(2 * d, nkv * hd, bias=False)
        self.o = torch.nn.Linear(nh * hd, d, bias=False)
        self.post_norm = torch.nn.Parameter(torch.ones(d))
        self.gate = torch.nn.Linear(d, ffn, bias=False)
        self.up = torch.nn.Linear(d, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, d, bias=False)
        self.norm = torch.nn.Parameter(torch.ones(d))
        self.lm = torch.nn.Parameter(lm.clone())

    def logits(self, x):
        return rmsnorm(x, self.norm, self.i["eps"]) @ self.lm.T

    def unrolled(self, emb, states, steps):
        """emb [B, T, d] = embed(x_{j+1}); states [B, T, 3d] = the target's
        states of token j. Step s (0-based) row j reads embed(x_{j+s+1}) and
        step 0's fc(states) or its own step s-1 output, at position j+s,
        attending like a draft tree row: to the step-0 rows 0..j and its own
        chain's earlier steps. Returns each step's pre-norm outputs."""
        B, T, _ = states.shape
        i = self.i
        eps, hd = i["eps"], i["head_dim"]
        rep = i["n_head"] // i["n_kv_head"]
        pos = torch.arange(T)
        scale = 1.0 / math.sqrt(hd)
        outs, selfs = [], []
        h = self.fc(states)
        K1 = V1 = None
        for s in range(steps):
            n = T - s
            hh = h[:, :n]
            a = torch.cat([rmsnorm(emb[:, s:s + n], self.in_norm, eps),
                           rmsnorm(hh, self.hidden_norm, eps)], dim=-1)
            p = pos[:n] + s
            q = apply_rope(self.q(a).view(B, n, i["n_head"], hd), p, self.tables, self.neox)
            k = apply_rope(self.k(a).view(B, n, i["n_kv_head"], hd), p, self.tables, self.neox)
            v = self.v(a).view(B, n, i["n_kv_head"], hd)
            q = q.transpose(1, 2)
            k = k.repeat_interleave(rep, 2).transpose(1, 2)
            v = v.repeat_interleave(rep, 2).transpose(1, 2)
            if s == 0:
                K1, V1 = k, v
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                sc = (q @ K1.transpose(-1, -2)) * scale
                mask = torch.ones(n, T, dtype=torch.bool).tril(diagonal=0)
                sc = sc.masked_fill(~mask, float("-inf"))
                extra = [((q * kk[:, :, :n]).sum(-1, keepdim=True) * scale, vv[:, :, :n])
                         for kk, vv in selfs]
                extra.append(((q * k).sum(-1, keepdim=True) * scale, v))
                pr = torch.softmax(torch.cat([sc] + [e[0] for e in extra], dim=-1), dim=-1)
                att = pr[..., :T] @ V1
                for idx, (_, vv) in enumerate(extra):
                    att = att + pr[..., T + idx:T + idx + 1] * vv
            x = hh + self.o(att.transpose(1, 2).reshape(B, n, -1))
            f = rmsnorm(x, self.post_norm, eps)
            x = x + self.down(F.silu(self.gate(f)) * self.up(f))
            outs.append(x)
            if s > 0:
                selfs.append((k, v))
            h = x
        return outs


def train_eagle3(a, info, w, target, toks, probs, gen, t0):
    layers = default_eagle3_layers(info["n_layer"])
    with torch.no_grad():
        st = []
        for b in range(0, a.n_seqs, 64):
            states = {l: None for l in layers}
            target.forward(toks[b:b + 64], states=states)
            st.append(torch.cat([states[l] for l in layers], dim=-1))
        st = torch.cat(st)
    ffn = a.ffn or info["ffn"]
    head = Eagle3Head(info, ffn, target.tables, target.neox, w["output.weight"])
    emb_table = w["token_embd.weight"]
    n_train = int(a.n_seqs * 0.9)
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, weight_decay=0.0)
    n_steps = a.epochs * ((n_train + a.batch - 1) // a.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=n_steps,
                                                pct_start=0.1)
    S = a.unroll

    def losses(idx):
        x, p, sv = toks[idx], probs[idx], st[idx]
        L = x.shape[1]
        T = L - 1 - S
        emb = emb_table[x[:, 1:]]
        outs = head.unrolled(emb, sv[:, :T + S - 1], S)
        total, acc = 0.0, []
        for s, out in enumerate(outs):
            n = min(out.shape[1], T)
            logp = torch.log_softmax(head.logits(out[:, :n]), -1)
            tgt = p[:, s + 1:s + 1 + n]  # the target's distribution of token j+s+2
            total = total + (a.unroll_decay ** s) * -(tgt * logp).sum(-1).mean()
            acc.append((logp.argmax(-1) == tgt.argmax(-1)).float().mean().item())
        return total, acc

    for ep in range(a.epochs):
        perm = torch.randperm(n_train, generator=gen)
        for b in range(0, n_train, a.batch):
            loss, _ = losses(perm[b:b + a.batch])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
        with torch.no_grad():
            vl, vacc = losses(torch.arange(n_train, a.n_seqs))
        print("epoch %d: validation loss %.4f, top-1 agreement by step %s (%.0f s)"
              % (ep + 1, vl.item(), " ".join("%.3f" % v for v in vacc), time.time() - t0),
              file=sys.stderr)
    sd = {k: v.detach().numpy() for k, v in head.state_dict().items()}
    tensors = {
        "fc.weight": sd["fc.weight"],
        "blk.0.attn_norm.weight": sd["in_norm"],
        "blk.0.hidden_norm.weight": sd["hidden_norm"],
        "blk.0.attn_q.weight": sd["q.weight"],
        "blk.0.attn_k.weight": sd["k.weight"],
        "blk.0.attn_v.weight": sd["v.weight"],
        "blk.0.attn_output.weight": sd["o.weight"],
        "blk.0.ffn_norm.weight": sd["post_norm"],
        "blk.0.ffn_gate.weight": sd["gate.weight"],
        "blk.0.ffn_up.weight": sd["up.weight"],
        "blk.0.ffn_down.weight": sd["down.weight"],
        "output_norm.weight": sd["norm"],
        "output.weight": sd["lm"],
    }
    write_eagle3(a.output, info, tensors, np.zeros(info["n_vocab"], np.int64), ffn,
                 info["n_head"], info["n_kv_head"], info["eps"], layers)
    print("wrote %s in %.0f s" % (a.output, time.time() - t0), file=sys.stderr)


# ---- Medusa heads ----------------------------------------------------------------

class MedusaHeads(torch.nn.Module):
    def __init__(self, d, n_heads, n_layers, lm, share_lm):
        super().__init__()
        self.res = torch.nn.ModuleList()
        for _ in range(n_heads):
            blocks = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(n_layers)])
            for b in blocks:
                torch.nn.init.zeros_(b.weight)  # each head starts as the target's next token
            self.res.append(blocks)
        self.lm = None if share_lm else torch.nn.ParameterList(
            [torch.nn.Parameter(lm.clone()) for _ in range(n_heads)])
        self.frozen_lm = lm

    def forward(self, f):
        """f [..., d] -> logits per head, a list of [..., V]."""
        out = []
        for i, blocks in enumerate(self.res):
            x = f
            for b in blocks:
                x = x + F.silu(b(x))
            out.append(x @ (self.frozen_lm if self.lm is None else self.lm[i]).T)
        return out


def medusa_tree(logps, depth, top_k, budget):
    """cairn_medusa_draft: the best `budget` paths by summed log-probability,
    head k's guesses among its best max(2, top_k >> k). logps: [K][V]
    (numpy). Returns the set of token paths (tuples)."""
    import heapq
    K = min(depth, len(logps))
    width = [max(top_k >> k, min(top_k, 2)) for k in range(K)]
    order = [np.argsort(-lp, kind="stable")[:width[k]] for k, lp in enumerate(logps[:K])]
    heap = [(-float(logps[0][order[0][0]]), 0, (), 0)]  # (-score, tiebreak, parent path, rank)
    chosen, n = set(), 0
    while heap and len(chosen) < budget:
        neg, _, parent, rank = heapq.heappop(heap)
        k = len(parent)
        path = parent + (int(order[k][rank]),)
        chosen.add(path)
        base = -neg - float(logps[k][order[k][rank]])
        n += 1
        if rank + 1 < width[k]:
            heapq.heappush(heap, (-(base + float(logps[k][order[k][rank + 1]])), n, parent,
                                  rank + 1))
        if k + 1 < K:
            n += 1
            heapq.heappush(heap, (neg - float(logps[k + 1][order[k + 1][0]]), n, path, 0))
    return chosen


@torch.no_grad()
def medusa_tau(heads, toks, feats, greedy_from, depth, top_k, budget):
    """Greedy decoding's tokens per target forward over the sequences'
    greedy stretches: at position j (token j+1 pending) the step accepts the
    longest tree path that the greedy continuation j+2.. follows."""
    steps = tokens = 0
    for b in range(toks.shape[0]):
        j = int(greedy_from[b])
        L = toks.shape[1]
        lp = [torch.log_softmax(x, -1).numpy() for x in heads(feats[b])]
        while j + 2 < L:
            tree = medusa_tree([x[j] for x in lp], depth, top_k, budget)
            a = 0
            while j + 2 + a < L and tuple(int(t) for t in toks[b, j + 2:j + 3 + a]) in tree:
                a += 1
            steps += 1
            tokens += 1 + a
            j += 1 + a
    return tokens / max(steps, 1)


def train_medusa(a, info, w, toks, feats, probs, greedy_from, gen, t0):
    d = info["dim"]
    lm = w["output.weight"]
    K = a.medusa_heads
    heads = MedusaHeads(d, K, a.medusa_layers, lm, a.medusa_share_lm)
    n_train = int(a.n_seqs * 0.9)
    opt = torch.optim.AdamW(heads.parameters(), lr=a.lr, weight_decay=0.0)
    n_steps = a.epochs * ((n_train + a.batch - 1) // a.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=n_steps,
                                                pct_start=0.1)

    def losses(idx):
        f, p = feats[idx], probs[idx]
        L = f.shape[1]
        total, acc = 0.0, []
        for k, logits in enumerate(heads(f)):
            logp = torch.log_softmax(logits[:, :L - k - 1], -1)
            tgt = p[:, k + 1:]  # the target's distribution of token j+k+2
            total = total + (a.medusa_decay ** k) * -(tgt * logp).sum(-1).mean()
            acc.append((logp.argmax(-1) == tgt.argmax(-1)).float().mean().item())
        return total, acc

    for ep in range(a.epochs):
        perm = torch.randperm(n_train, generator=gen)
        for b in range(0, n_train, a.batch):
            loss, _ = losses(perm[b:b + a.batch])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
            opt.step()
            sched.step()
        with torch.no_grad():
            vl, vacc = losses(torch.arange(n_train, a.n_seqs))
        print("epoch %d: validation loss %.4f, top-1 agreement by head %s (%.0f s)"
              % (ep + 1, vl.item(), " ".join("%.3f" % v for v in vacc), time.time() - t0),
              file=sys.stderr)
    val = torch.arange(n_train, a.n_seqs)
    g = greedy_from[val]
    keep = g < toks.shape[1] - 8
    tau = medusa_tau(heads, toks[val][keep], feats[val][keep], g[keep], a.tau_depth, a.tau_top_k,
                     a.tau_n_draft)
    print("greedy tau on %d validation stretches (depth %d, top_k %d, %d rows): %.3f"
          % (int(keep.sum()), a.tau_depth, a.tau_top_k, a.tau_n_draft, tau), file=sys.stderr)
    out = []
    for i in range(K):
        res = [(blk.weight.detach().numpy(), blk.bias.detach().numpy()) for blk in heads.res[i]]
        own = None if heads.lm is None else heads.lm[i].detach().numpy()
        out.append({"res": res, "output": own})
    write_medusa(a.output, info, out, a.medusa_layers)
    print("wrote %s in %.0f s" % (a.output, time.time() - t0), file=sys.stderr)


def train_generated(a, info, w, gen, t0):
    """--kind eagle3 / medusa: sequences generated here, with the target's
    features and full distributions."""
    target = Target(info, w, a.seq_len + 8)
    bos = 1
    r = gguf.GGUFReader(a.target)
    if "tokenizer.ggml.bos_token_id" in r.fields:
        fld = r.fields["tokenizer.ggml.bos_token_id"]
        bos = int(fld.parts[fld.data[0]][0])
    temps = [float(x) for x in a.temps.split(",")]
    toks, greedy_from = generate(target, a.n_seqs, a.seq_len, temps, a.greedy_share, bos, gen)
    with torch.no_grad():
        feats, probs = [], []
        for b in range(0, a.n_seqs, 64):
            f, lg = target.forward(toks[b:b + 64])
            feats.append(f)
            probs.append(torch.softmax(lg, -1))
        feats, probs = torch.cat(feats), torch.cat(probs)
    print("generated %d x %d tokens and features in %.1f s" % (a.n_seqs, a.seq_len, time.time() - t0),
          file=sys.stderr)

    if a.kind == "medusa":
        return train_medusa(a, info, w, toks, feats, probs, greedy_from, gen, t0)
    return train_eagle3(a, info, w, target, toks, probs, gen, t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--data", help="JSON-lines token sequences to train on (tools/eagle_data.py) "
                                   "instead of generating them here")
    ap.add_argument("--features", help="with --data: cache of the target's features (read if it "
                                       "exists, else written), so a rerun with other training "
                                       "settings skips the target forwards")
    ap.add_argument("--n-seqs", type=int, default=640, help="sequences generated (without --data)")
    ap.add_argument("--seq-len", type=int, default=160, help="their length (without --data)")
    ap.add_argument("--temps", default="0.6,0.8,1.0", help="sampling temperatures, cycled")
    ap.add_argument("--greedy-share", type=float, default=0.5)
    ap.add_argument("--prompt-weight", type=float, default=0.1,
                    help="loss weight of rows inside a --data sequence's prompt (answers: 1)")
    ap.add_argument("--cls-vocab", choices=("full", "data"), default=None,
                    help="vocabulary of the cross-entropy: all tokens, or those occurring in the "
                         "data (default: data for vocabularies over 32768, which would otherwise "
                         "dominate the training time)")
    ap.add_argument("--epochs", type=int, default=10,
                    help="0 (with --data --features): stop once the features are written")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=float, default=0.1,
                    help="share of the steps over which the rate rises linearly (--kind eagle)")
    ap.add_argument("--w-cls", type=float, default=0.5, help="weight of the cross-entropy")
    ap.add_argument("--unroll", type=int, default=3)
    ap.add_argument("--unroll-decay", type=float, default=0.6)
    ap.add_argument("--ffn", type=int, default=0, help="head FFN width (default: target's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kind", choices=("eagle", "eagle3", "medusa"), default="eagle")
    ap.add_argument("--medusa-heads", type=int, default=3)
    ap.add_argument("--medusa-layers", type=int, default=1)
    ap.add_argument("--medusa-decay", type=float, default=0.8,
                    help="loss weight of head k: decay^k")
    ap.add_argument("--medusa-share-lm", action="store_true",
                    help="heads read the target's LM head (frozen; not written)")
    ap.add_argument("--tau-depth", type=int, default=5, help="tree shape of the tau report")
    ap.add_argument("--tau-top-k", type=int, default=8)
    ap.add_argument("--tau-n-draft", type=int, default=32)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(a.seed)

    t0 = time.time()
    info, w = load_target(a.target)
    print("loaded %s in %.0f s" % (a.target, time.time() - t0), file=sys.stderr)
    if a.kind != "eagle":
        if a.data:
            raise SystemExit("eagle_train.py: --data trains --kind eagle only")
        return train_generated(a, info, w, gen, t0)
    if a.data:
        seqs = read_data(a.data)
        max_len = max(len(x) for x, _ in seqs)
    else:
        max_len = a.seq_len
    target = Target(info, w, max_len + 8)
    if a.data and a.features and os.path.exists(a.features):
        feats = torch.load(a.features)
        if [len(x) for x in feats] != [len(x) for x, _ in seqs]:
            raise SystemExit("eagle_train.py: %s holds features of other sequences" % a.features)
        print("features of %d sequences read from %s" % (len(feats), a.features), file=sys.stderr)
    elif a.data:
        feats, agree = record_features(target, seqs, 4)
        if a.features:
            torch.save(feats, a.features)
        print("features of %d sequences (%d tokens) from %s in %.0f s; target argmax = next "
              "answer token on %.3f of the first 4 answers"
              % (len(seqs), sum(len(x) for x, _ in seqs), a.data, time.time() - t0, agree),
              file=sys.stderr)
    else:
        bos = 1
        r = gguf.GGUFReader(a.target)
        if "tokenizer.ggml.bos_token_id" in r.fields:
            fld = r.fields["tokenizer.ggml.bos_token_id"]
            bos = int(fld.parts[fld.data[0]][0])
        temps = [float(x) for x in a.temps.split(",")]
        toks, _ = generate(target, a.n_seqs, a.seq_len, temps, a.greedy_share, bos, gen)
        with torch.no_grad():
            feats = []
            for b in range(0, a.n_seqs, 64):
                feats += list(target.forward(toks[b:b + 64], logits=False)[0])
        seqs = [(toks[k], 1) for k in range(a.n_seqs)]
        print("generated %d x %d tokens and features in %.1f s" % (a.n_seqs, a.seq_len,
              time.time() - t0), file=sys.stderr)
    if a.epochs == 0:
        return  # --epochs 0 with --data --features: only fill the features cache

    # all sequences right-padded to one length; pads sit after every real row,
    # so causal attention never lets a real row see one, and the loss mask
    # drops the rows that would read or predict one
    N, L, d = len(seqs), max_len, info["dim"]
    toks = torch.zeros(N, L, dtype=torch.long)
    feat_all = torch.zeros(N, L, d)
    lens = torch.tensor([len(x) for x, _ in seqs])
    plens = torch.tensor([p for _, p in seqs])
    for k, (x, _) in enumerate(seqs):
        toks[k, :len(x)] = x
        feat_all[k, :len(x)] = feats[k]
    del feats

    # the regression compares features in units of their mean magnitude, so
    # --w-cls weighs the two terms alike for any target (a qwen2 feature is
    # far larger than a stories260K one)
    real = torch.arange(L)[None, :] < lens[:, None]
    f_scale = float(feat_all[real].abs().mean())
    print("feature mean |f| %.3f" % f_scale, file=sys.stderr)

    emb_table, lm = w["token_embd.weight"], w["output.weight"]
    cls_vocab = a.cls_vocab or ("data" if info["n_vocab"] > 32768 else "full")
    if cls_vocab == "data":
        # the target's distribution renormalised over the tokens that occur:
        # the answers' tokens are (greedy) or are near (sampled) its argmaxes
        vocab = torch.unique(torch.cat([x for x, _ in seqs]))
        lm_cls = lm[vocab].contiguous()
    else:
        lm_cls = lm
    print("cross-entropy over %d of %d tokens" % (lm_cls.shape[0], lm.shape[0]), file=sys.stderr)

    ffn = a.ffn or info["ffn"]
    head = Head(info, ffn, target.tables, target.neox)
    n_train = max(1, int(N * 0.9))
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, weight_decay=0.0)
    n_steps = a.epochs * ((n_train + a.batch - 1) // a.batch)
    # linear warm-up over the first --warmup of the steps, then a cosine down to a
    # tenth: Adam's first steps at the full rate are what made a qwen2 head's
    # loss jump (fewer than 200 steps leave OneCycle's warm-up too short)
    warm = max(1, int(n_steps * a.warmup))

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(1, n_steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    S = a.unroll

    def losses(idx):
        Lb = int(lens[idx].max())
        x = toks[idx, :Lb]               # [B, Lb]
        f = feat_all[idx, :Lb]           # [B, Lb, d]
        T = Lb - 1 - S                   # rows j = 0..T-1 have targets for every step
        emb = emb_table[x[:, 1:]]        # emb[:, j] = embed(x_{j+1})
        outs = head.unrolled(emb, f[:, :T + S - 1], S) if S > 1 else head.unrolled(emb, f[:, :T], 1)
        total, acc = 0.0, []
        for s, out in enumerate(outs):
            n = min(out.shape[1], T)
            pred = out[:, :n]
            tgt_f = f[:, s + 1:s + 1 + n]
            # row j reads token j+s+1 and predicts the feature there: real
            # only while j+s+1 < len; an answer row once j+s+1 >= prompt_len-1
            # (the position whose next token is the answer's first)
            at = torch.arange(n)[None, :] + s + 1
            valid = (at < lens[idx, None]).float()
            wt = valid * torch.where(at >= plens[idx, None] - 1, 1.0, a.prompt_weight)
            reg = (F.smooth_l1_loss(pred / f_scale, tgt_f / f_scale, reduction="none").mean(-1)
                   * wt).sum() / wt.sum().clamp(min=1)
            # the LM head (most of the cost) only on answer rows: prompt rows
            # train the feature regression and serve as attention context
            ans = (valid * (at >= plens[idx, None] - 1).float()).bool()
            with torch.no_grad():
                tgt_p = torch.softmax(tgt_f[ans] @ lm_cls.T, -1)
            logp = torch.log_softmax(pred[ans] @ lm_cls.T, -1)
            cls = -(tgt_p * logp).sum(-1).mean() if len(logp) else 0.0
            total = total + (a.unroll_decay ** s) * (reg + a.w_cls * cls)
            hit = (logp.argmax(-1) == tgt_p.argmax(-1)).float()
            acc.append(float(hit.mean()) if len(hit) else 0.0)
        return total, acc

    best = None
    for ep in range(a.epochs):
        perm = torch.randperm(n_train, generator=gen)
        head.train()
        for b in range(0, n_train, a.batch):
            loss, _ = losses(perm[b:b + a.batch])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
        with torch.no_grad():
            head.eval()
            vl, vacc = 0.0, [0.0] * S
            val = torch.arange(n_train, N) if N > n_train else torch.arange(N)
            for b in range(0, len(val), a.batch):
                l, ac = losses(val[b:b + a.batch])
                share = len(val[b:b + a.batch]) / len(val)
                vl += float(l) * share
                vacc = [v + x * share for v, x in zip(vacc, ac)]
        print("epoch %d: validation loss %.4f, top-1 agreement on answers by step %s (%.0f s)"
              % (ep + 1, vl, " ".join("%.3f" % v for v in vacc), time.time() - t0),
              file=sys.stderr)
        if best is None or vl < best[0]:
            best = (vl, ep + 1)
            # written at every improvement, so an interrupted run leaves a usable head
            save_head(a.output, info, head.state_dict(), ffn)
    print("kept epoch %d (lowest validation loss) in %s (%.0f s)"
          % (best[1], a.output, time.time() - t0), file=sys.stderr)


def save_head(path, info, state, ffn):
    sd = {k: v.detach().numpy() for k, v in state.items()}
    tensors = {
        "fc.weight": sd["fc.weight"],
        "fc.bias": sd["fc.bias"],
        "blk.0.attn_q.weight": sd["q.weight"],
        "blk.0.attn_k.weight": sd["k.weight"],
        "blk.0.attn_v.weight": sd["v.weight"],
        "blk.0.attn_output.weight": sd["o.weight"],
        "blk.0.ffn_norm.weight": sd["ffn_norm"],
        "blk.0.ffn_gate.weight": sd["gate.weight"],
        "blk.0.ffn_up.weight": sd["up.weight"],
        "blk.0.ffn_down.weight": sd["down.weight"],
    }
    write_head(path, info, tensors, ffn)


if __name__ == "__main__":
    main()
