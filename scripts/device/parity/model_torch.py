"""An independent PyTorch implementation of docs/MODEL.md §4 (float64), written from the contract,
not from Tandem's C++: streams (§4.1), the layer (§4.2), Engram (§4.3), Gated DeltaNet in its
recurrent form (§4.4), gated attention with the query-selected sparse indexer (§4.5), the MoE
(§4.6) and the MTP draft head (§4.7).

Weights are a dict of GGUF tensor names to torch tensors in PyTorch order (gguf_read.py), so a
ggml {in, out} matrix W acts as W @ x. Norm weights are the stored values (1+w baked in).
"""
import math

import torch

F64 = torch.float64
U64 = (1 << 64) - 1


def rms(x, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def silu(x):
    return x * torch.sigmoid(x)


def rope(x, pos, rot, theta):
    """NeoX RoPE at position `pos` on the last dim: dims i and i+rot/2 (i < rot/2) rotate."""
    if rot == 0:
        return x
    half = rot // 2
    i = torch.arange(half, dtype=F64)
    ang = pos * theta ** (-2.0 * i / rot)
    c, s = torch.cos(ang), torch.sin(ang)
    out = x.clone()
    a, b = x[..., :half], x[..., half:rot]
    out[..., :half] = a * c - b * s
    out[..., half:rot] = a * s + b * c
    return out


class Config:
    """The hyper-parameters of §1, from GGUF metadata."""

    def __init__(self, meta, tensors):
        a = meta["general.architecture"]
        g = lambda k, d=None: meta.get(f"{a}.{k}", d)
        self.arch = a
        self.h = g("embedding_length")
        self.nextn = g("nextn_predict_layers", 0)
        self.L = g("block_count") - self.nextn
        self.eps = g("attention.layer_norm_rms_epsilon")
        rec = g("attention.recurrent_layers")
        if rec is not None:
            self.gdn = [bool(rec[i]) for i in range(self.L)] + [False] * self.nextn
        else:
            iv = g("full_attention_interval")
            self.gdn = [(i + 1) % iv != 0 for i in range(self.L)] + [False] * self.nextn
        self.nh, self.kvh, self.hd = g("attention.head_count"), g("attention.head_count_kv"), g("attention.key_length")
        self.rot, self.theta = g("rope.dimension_count", self.hd), g("rope.freq_base", 10000.0)
        self.nk, self.nv, self.dk, self.kk = g("ssm.group_count"), g("ssm.time_step_rank"), g("ssm.state_size"), g("ssm.conv_kernel")
        self.E, self.K = g("expert_count"), g("expert_used_count")
        self.S, self.lr = g("hyper.stream_count", 1), g("hyper.rank", 0)
        self.ih = g("attention.indexer.head_count", 0)
        self.di, self.cr, self.keep = g("attention.indexer.key_length", 0), g("attention.indexer.block_size", 0), g("attention.indexer.top_blocks", 0)
        self.engram_layers = list(g("engram.layers", []))
        if self.engram_layers:
            self.eN, self.eK, self.de = g("engram.max_ngram"), g("engram.heads"), g("engram.head_dim")
            self.eck, self.edil = g("engram.conv_kernel"), g("engram.conv_dilation")
            self.emult, self.esizes = list(g("engram.multipliers")), list(g("engram.table_sizes"))
        self.V = tensors["token_embd.weight"].shape[0]


class Model:
    def __init__(self, cfg, W):
        self.c, self.W = cfg, W

    def has(self, n):
        return n in self.W

    # ---- §4.1 streams ----
    def read(self, H, prefix, plain, with_inject=True):
        """H [T, S, h] -> (x [T, h], a [T, S])."""
        c, W = self.c, self.W
        T, S, h = H.shape
        if self.has(prefix + "hc_norm.weight"):
            N = W[prefix + "hc_norm.weight"].reshape(S, h) * rms(H, c.eps)
            if S == 1:
                return N[:, 0], torch.ones(T, 1, dtype=F64)
            vec = N.reshape(T, S * h)
            z = vec @ W[prefix + "hc_down.weight"].T
            m = (silu(z) @ W[prefix + "hc_up.weight"].T).reshape(T, S, h)
            x = (2.0 / S) * (torch.sigmoid(m) * N).sum(1)
            if with_inject and self.has(prefix + "hc_inject.weight"):
                a = 2 * torch.sigmoid(vec @ W[prefix + "hc_inject.weight"].T)
            else:
                a = torch.ones(T, S, dtype=F64)
            return x, a
        assert S == 1
        return W[plain] * rms(H[:, 0], c.eps), torch.ones(T, 1, dtype=F64)

    # ---- §4.3 Engram ----
    def engram(self, layer, tokens, H):
        c, W, p = self.c, self.W, f"blk.{layer}."
        j = c.engram_layers.index(layer)
        T, S, h = H.shape
        N, K = c.eN, c.eK
        mult = c.emult[j * N:(j + 1) * N]
        sizes = c.esizes[j * (N - 1) * K:(j + 1) * (N - 1) * K]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        tmap = W.get("engram_token_map", W.get("engram_token_map.weight"))
        xs = [int(tmap.reshape(-1)[t]) if tmap is not None else int(t) for t in tokens]
        embd = W[p + "engram_embd.weight"]
        rows = []
        for pos in range(T):
            parts = []
            for n in range(2, N + 1):
                mix = 0
                for i in range(n):
                    xv = xs[pos - i] if pos - i >= 0 else 0
                    mix ^= (xv * mult[i]) & U64
                for k in range(K):
                    idx = (n - 2) * K + k
                    parts.append(embd[offsets[idx] + mix % sizes[idx]])
            rows.append(torch.cat(parts))
        e = torch.stack(rows)
        kv = (e @ W[p + "engram_key.weight"].T).reshape(T, S, h)
        v = e @ W[p + "engram_value.weight"].T
        gk = W[p + "engram_key_norm.weight"].reshape(S, h)
        gq = W[p + "engram_query_norm.weight"].reshape(S, h)
        g = ((gk * rms(kv, c.eps)) * (gq * rms(H, c.eps))).sum(-1) / math.sqrt(h)
        alpha = torch.sigmoid(torch.sign(g) * torch.sqrt(torch.clamp(g.abs(), min=1e-6)))
        u = alpha[..., None] * v[:, None, :]
        ubar = W[p + "engram_conv_norm.weight"].reshape(S, h) * rms(u, c.eps)
        wc = W[p + "engram_conv.weight"].reshape(S, h, c.eck)
        conv = torch.zeros_like(u)
        for q in range(c.eck):
            shift = (c.eck - 1 - q) * c.edil
            if shift < T:
                conv[shift:] += wc[:, :, q] * ubar[:T - shift]
        return H + u + silu(conv)

    # ---- §4.4 Gated DeltaNet ----
    def gdn(self, p, x):
        c, W = self.c, self.W
        T = x.shape[0]
        nk, nv, dk, r = c.nk, c.nv, c.dk, c.nv // c.nk
        cd = 2 * nk * dk + nv * dk
        qkv = x @ W[p + "attn_qkv.weight"].T
        z = (x @ W[p + "attn_gate.weight"].T).reshape(T, nv, dk)
        ba = (x @ W[p + "ssm_ba.weight"].T).reshape(T, nk, 2 * r)
        b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
        conv_w = W[p + "ssm_conv1d.weight"].reshape(cd, c.kk)
        xin = torch.cat([torch.zeros(c.kk - 1, cd, dtype=F64), qkv])
        conv = sum(conv_w[:, t] * xin[t:t + T] for t in range(c.kk))
        act = silu(conv)
        q = act[:, :nk * dk].reshape(T, nk, dk)
        k = act[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
        v = act[:, 2 * nk * dk:].reshape(T, nv, dk)
        beta = torch.sigmoid(b)
        glog = W[p + "ssm_a"].reshape(nv) * torch.nn.functional.softplus(a + W[p + "ssm_dt.bias"].reshape(nv))
        group = torch.arange(nv) // r
        St = torch.zeros(nv, dk, dk, dtype=F64)
        outs = []
        for t in range(T):
            qh = q[t, group] / torch.sqrt((q[t, group] ** 2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
            kh = k[t, group] / torch.sqrt((k[t, group] ** 2).sum(-1, keepdim=True) + 1e-6)
            St = St * torch.exp(glog[t])[:, None, None]
            delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", St, kh))
            St = St + torch.einsum("hk,hv->hkv", kh, delta)
            outs.append(torch.einsum("hkv,hk->hv", St, qh))
        o = torch.stack(outs)
        o = W[p + "ssm_norm.weight"].reshape(dk) * rms(o, c.eps) * silu(z)
        return o.reshape(T, nv * dk) @ W[p + "ssm_out.weight"].T

    # ---- §4.5 attention ----
    def attention(self, p, x, pos0=0):
        c, W = self.c, self.W
        T = x.shape[0]
        nh, kvh, hd = c.nh, c.kvh, c.hd
        qg = (x @ W[p + "attn_q.weight"].T).reshape(T, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:]
        k = (x @ W[p + "attn_k.weight"].T).reshape(T, kvh, hd)
        v = (x @ W[p + "attn_v.weight"].T).reshape(T, kvh, hd)
        q = W[p + "attn_q_norm.weight"].reshape(hd) * rms(q, c.eps)
        k = W[p + "attn_k_norm.weight"].reshape(hd) * rms(k, c.eps)
        q = torch.stack([rope(q[t], pos0 + t, c.rot, c.theta) for t in range(T)])
        k = torch.stack([rope(k[t], pos0 + t, c.rot, c.theta) for t in range(T)])
        attended = [list(range(t + 1)) for t in range(T)]
        if c.ih > 0 and self.has(p + "attn_idx_qk.weight"):
            assert pos0 == 0
            attended = self.select(p, x)
        groups = nh // kvh
        out = torch.zeros(T, nh, hd, dtype=F64)
        for t in range(T):
            idx = torch.tensor(attended[t])
            for hq in range(nh):
                kv = hq // groups
                s = (k[idx, kv] @ q[t, hq]) / math.sqrt(hd)
                out[t, hq] = torch.softmax(s, 0) @ v[idx, kv]
        out = out * torch.sigmoid(gate)
        return out.reshape(T, nh * hd) @ W[p + "attn_output.weight"].T

    def select(self, p, x):
        c, W = self.c, self.W
        T = x.shape[0]
        ih, di, cr, keep = c.ih, c.di, c.cr, c.keep
        iqk = x @ W[p + "attn_idx_qk.weight"].T
        iq = W[p + "attn_idx_q_norm.weight"].reshape(di) * rms(iqk[:, :ih * di].reshape(T, ih, di), c.eps)
        iq = torch.stack([rope(iq[t], t, c.rot, c.theta) for t in range(T)])
        ik = iqk[:, ih * di:]
        kn = W[p + "attn_idx_k_norm.weight"].reshape(di)
        blocks = [rope(kn * rms(ik[b * cr:(b + 1) * cr].mean(0), c.eps), b * cr, c.rot, c.theta) for b in range(T // cr)]
        attended = []
        for t in range(T):
            own = t // cr
            nb = own
            if nb <= keep:
                attended.append(list(range(t + 1)))
                continue
            scores = [(torch.relu(iq[t] @ blocks[b]).sum() / math.sqrt(di)).item() for b in range(nb)]
            chosen = sorted(range(nb), key=lambda b: (-scores[b], b))[:keep]
            pos = [q for b in sorted(chosen) for q in range(b * cr, b * cr + cr)]
            attended.append(pos + list(range(own * cr, t + 1)))
        return attended

    # ---- §4.6 MoE ----
    def moe(self, p, x):
        c, W = self.c, self.W
        pi = torch.softmax(x @ W[p + "ffn_gate_inp.weight"].T, -1)
        gate, up, down = W[p + "ffn_gate_exps.weight"], W[p + "ffn_up_exps.weight"], W[p + "ffn_down_exps.weight"]
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            order = sorted(range(c.E), key=lambda e: (-pi[t, e].item(), e))[:c.K]
            wsum = sum(pi[t, e] for e in order)
            for e in order:
                y[t] += (pi[t, e] / wsum) * (down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])))
        if self.has(p + "ffn_gate_shexp.weight"):
            sg = torch.sigmoid(x @ W[p + "ffn_gate_inp_shexp.weight"].reshape(-1))
            sh = silu(x @ W[p + "ffn_gate_shexp.weight"].T) * (x @ W[p + "ffn_up_shexp.weight"].T)
            y = y + sg[:, None] * (sh @ W[p + "ffn_down_shexp.weight"].T)
        return y

    # ---- §4.2 layer and the whole model ----
    def layer(self, i, tokens, H, pos0=0):
        c, p = self.c, f"blk.{i}."
        if i in c.engram_layers:
            H = self.engram(i, tokens, H)
        x, a = self.read(H, p + "attn_", p + "attn_norm.weight")
        y = self.gdn(p, x) if c.gdn[i] else self.attention(p, x, pos0)
        H = H + a[:, :, None] * y[:, None, :]
        x, a = self.read(H, p + "ffn_", p + "post_attention_norm.weight")
        return H + a[:, :, None] * self.moe(p, x)[:, None, :]

    def output_matrix(self):
        return self.W.get("output.weight", self.W["token_embd.weight"])

    def forward(self, tokens):
        """Logits [T, V] at every position, and the MTP input hsrc [T, S·h or h]."""
        c = self.c
        T = len(tokens)
        H = self.W["token_embd.weight"][torch.tensor(tokens)][:, None, :].repeat(1, c.S, 1)
        for i in range(c.L):
            H = self.layer(i, tokens, H)
        x, _ = self.read(H, "output_", "output_norm.weight", with_inject=False)
        hsrc = H.reshape(T, -1) if c.S > 1 else x
        return x @ self.output_matrix().T, hsrc

    # ---- §4.7 MTP ----
    def draft(self, tokens, hsrc, next_token, k):
        """Greedy MTP drafts after `tokens` (main-model hsrc per position) and next_token."""
        c, W = self.c, self.W
        L, S, h = c.L, c.S, c.h
        p = f"blk.{L}."
        embed = W.get(p + "nextn.embed_tokens.weight", W["token_embd.weight"])
        head = W.get(p + "nextn.shared_head_head.weight", self.output_matrix())
        eh = W[p + "nextn.eh_proj.weight"]  # [h, 2h]: embedding half first
        hs = [hsrc[t] for t in range(len(tokens))]
        pair = list(tokens[1:]) + [next_token]
        drafts, all_logits = [], []
        for _ in range(k):
            T = len(pair)
            e = W[p + "nextn.enorm.weight"] * rms(embed[torch.tensor(pair)], c.eps)
            src = torch.stack(hs).reshape(T, S, h)
            hn = W[p + "nextn.hnorm.weight"].reshape(S, h) * rms(src, c.eps)
            Hp = hn @ eh[:, h:].T + (e @ eh[:, :h].T)[:, None, :]
            Hp = self.layer(L, pair, Hp)
            if S > 1:
                x, _ = self.read(Hp, p + "nextn.", None, with_inject=False)
            else:
                x = W[p + "nextn.shared_head_norm.weight"] * rms(Hp[:, 0], c.eps)
            logits = x[-1] @ head.T
            best = int(torch.argmax(logits))
            drafts.append(best)
            all_logits.append(logits)
            hs.append(Hp[-1].reshape(-1) if S > 1 else x[-1])
            pair.append(best)
        return drafts, torch.stack(all_logits)
