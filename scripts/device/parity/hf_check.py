"""transformers parity: a small random Qwen3NextForCausalLM (f32, and a bf16 copy), converted by
`tandem convert`, run by Tandem's CPU reference (`tandem logits`) and by transformers on the same
token ids. Also the MTP head (mtp.* tensors, which transformers does not model: written into the
checkpoint here) against model_torch.py's §4.7 fed with transformers' final-norm hidden states."""
import glob
import json
import math
import os
import shutil
import subprocess

import numpy as np
import torch

from model_torch import Model, rms
from q4x_check import rel_l2, tandem_logits

DIMS = dict(vocab_size=3000, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
            shared_expert_intermediate_size=48, rms_norm_eps=1e-6, max_position_embeddings=512,
            tie_word_embeddings=False, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            full_attention_interval=4, hidden_act="silu", bos_token_id=2998, eos_token_id=2999)
ROPE = dict(rope_theta=10000.0, partial_rotary_factor=0.25)


def make_config():
    from transformers import Qwen3NextConfig
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(DIMS["num_hidden_layers"])]
    kwargs = dict(DIMS, layer_types=layer_types)
    try:  # transformers 5: RoPE settings live in rope_parameters
        cfg = Qwen3NextConfig(**kwargs, rope_parameters=dict(ROPE, rope_type="default"))
    except TypeError:
        cfg = Qwen3NextConfig(**kwargs, **ROPE)
    for k, v in ROPE.items():  # transformers 4 reads them as attributes
        if not hasattr(cfg, k):
            setattr(cfg, k, v)
    cfg._attn_implementation = "eager"
    return cfg


# Scale of the random matrices and the upper end of A = exp(A_log) (PARITY_GAIN / PARITY_A_MAX
# override them for conditioning experiments). With matrices at 1/sqrt(fan_in) (gain 1) this
# 8-layer random model amplifies f32 rounding: transformers in f32 and in f64 differ by 2.4e-4 at
# 40 tokens, so no f32 implementation can be checked to 1e-4 against it. At gain 0.5 they differ
# by <= 4.1e-5 (measured on the GPU machine, 2026-11-29; docs/VALIDATION.md); A keeps Qwen3-Next's
# own range [1, 16].
GAIN = float(os.environ.get("PARITY_GAIN", "0.5"))
A_MAX = float(os.environ.get("PARITY_A_MAX", "16"))


def randomize(model, gen):
    """Weights with O(1) activations and clear routing margins (HF's init has zero norms and
    0.02-std matrices, which make every logit nearly tied)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(1, A_MAX, generator=gen)))
            elif name.endswith("dt_bias"):
                p.uniform_(-1, 1, generator=gen)
            elif name.endswith("linear_attn.norm.weight"):
                p.uniform_(0.9, 1.1, generator=gen)
            elif "norm" in name:
                p.uniform_(-0.1, 0.1, generator=gen)
            else:
                p.normal_(0, GAIN / math.sqrt(p.shape[-1]), generator=gen)


def mtp_tensors(cfg, gen):
    h, nh, kvh, hd, E, I, Ish = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                 cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size)
    shapes = {"mtp.fc.weight": [h, 2 * h], "mtp.pre_fc_norm_embedding.weight": [h],
              "mtp.pre_fc_norm_hidden.weight": [h], "mtp.norm.weight": [h]}
    p = "mtp.layers.0."
    shapes.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                   p + "self_attn.q_proj.weight": [nh * 2 * hd, h], p + "self_attn.k_proj.weight": [kvh * hd, h],
                   p + "self_attn.v_proj.weight": [kvh * hd, h], p + "self_attn.o_proj.weight": [h, nh * hd],
                   p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                   p + "mlp.gate.weight": [E, h], p + "mlp.shared_expert_gate.weight": [1, h],
                   p + "mlp.shared_expert.gate_proj.weight": [Ish, h], p + "mlp.shared_expert.up_proj.weight": [Ish, h],
                   p + "mlp.shared_expert.down_proj.weight": [h, Ish]})
    for e in range(E):
        shapes.update({f"{p}mlp.experts.{e}.gate_proj.weight": [I, h], f"{p}mlp.experts.{e}.up_proj.weight": [I, h],
                       f"{p}mlp.experts.{e}.down_proj.weight": [h, I]})
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = torch.empty(shape).uniform_(-0.1, 0.1, generator=gen)
        else:
            out[name] = torch.empty(shape).normal_(0, 1 / math.sqrt(shape[-1]), generator=gen)
    return out


def write_tokenizer(d, V):
    """A byte-level BPE tokenizer.json by hand: 256 byte tokens, merges of common letter pairs,
    two special tokens at the top of the vocabulary (the other ids become [PAD] rows)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_char = {b: chr(c) for b, c in zip(bs, cs)}
    vocab = {byte_char[b]: b for b in range(256)}
    merges = []
    for a in "etaoinshr":
        for b in "etaoinshr":
            vocab[a + b] = len(vocab)
            merges.append(f"{a} {b}")
    tok = {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": merges},
           "added_tokens": [{"id": V - 2, "content": "<|endoftext|>", "special": True},
                            {"id": V - 1, "content": "<|im_end|>", "special": True}]}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}, f)


def save_checkpoint(model, mtp, d, dtype):
    from safetensors.torch import load_file, save_file
    model.to(dtype).save_pretrained(d, safe_serialization=True)
    model.to(torch.float32)
    state = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        state.update(load_file(f))
        os.remove(f)
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        os.remove(os.path.join(d, "model.safetensors.index.json"))
    state.update({k: v.to(dtype) for k, v in mtp.items()})
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(d, model.config.vocab_size)
    return sorted(state.keys())


def load_f32(d, dtype=torch.float32):
    """The checkpoint with eager attention and eager experts: transformers 5 otherwise runs the
    experts through torch's grouped_mm, which has no f64 kernel and is not the plain f32 loop."""
    from transformers import Qwen3NextForCausalLM
    kwargs = {"attn_implementation": "eager"}
    for extra in ({"experts_implementation": "eager"}, {}):
        try:
            m = Qwen3NextForCausalLM.from_pretrained(d, dtype=dtype, **kwargs, **extra)
            break
        except (TypeError, ValueError):
            try:
                m = Qwen3NextForCausalLM.from_pretrained(d, torch_dtype=dtype, **kwargs, **extra)
                break
            except (TypeError, ValueError):
                continue
    for cfg in (m.config, getattr(m.config, "text_config", None)):
        if cfg is not None and hasattr(cfg, "_experts_implementation"):
            cfg._experts_implementation = "eager"
    return m.eval()


def hf_greedy(model, ids, steps):
    seq, toks, margins, rows = list(ids), [], [], []
    with torch.no_grad():
        for _ in range(steps):
            row = model(input_ids=torch.tensor([seq])).logits[0, -1].double()
            top = torch.topk(row, 2).values
            margins.append(float(top[0] - top[1]))
            toks.append(int(torch.argmax(row)))
            rows.append(row.numpy())
            seq.append(toks[-1])
    return toks, margins, rows


def mtp_model(hf_state, cfg):
    """model_torch's Model over the HF MTP weights (zero-centred norms as 1+w, per HF semantics)."""
    from model_torch import Config
    c = Config.__new__(Config)
    c.h, c.eps, c.L, c.nextn, c.S = cfg.hidden_size, cfg.rms_norm_eps, cfg.num_hidden_layers, 1, 1
    c.gdn = [False] * (c.L + 1)
    c.nh, c.kvh, c.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    c.rot, c.theta = int(round(cfg.head_dim * ROPE["partial_rotary_factor"])), ROPE["rope_theta"]
    c.E, c.K, c.ih, c.engram_layers = cfg.num_experts, cfg.num_experts_per_tok, 0, []
    c.V = cfg.vocab_size
    g = lambda n: hf_state[n].double()
    p, s = f"blk.{c.L}.", "mtp.layers.0."
    W = {"token_embd.weight": g("model.embed_tokens.weight"), "output.weight": g("lm_head.weight"),
         p + "attn_norm.weight": 1 + g(s + "input_layernorm.weight"),
         p + "post_attention_norm.weight": 1 + g(s + "post_attention_layernorm.weight"),
         p + "attn_q.weight": g(s + "self_attn.q_proj.weight"), p + "attn_k.weight": g(s + "self_attn.k_proj.weight"),
         p + "attn_v.weight": g(s + "self_attn.v_proj.weight"), p + "attn_output.weight": g(s + "self_attn.o_proj.weight"),
         p + "attn_q_norm.weight": 1 + g(s + "self_attn.q_norm.weight"), p + "attn_k_norm.weight": 1 + g(s + "self_attn.k_norm.weight"),
         p + "ffn_gate_inp.weight": g(s + "mlp.gate.weight"),
         p + "ffn_gate_exps.weight": torch.stack([g(f"{s}mlp.experts.{e}.gate_proj.weight") for e in range(c.E)]),
         p + "ffn_up_exps.weight": torch.stack([g(f"{s}mlp.experts.{e}.up_proj.weight") for e in range(c.E)]),
         p + "ffn_down_exps.weight": torch.stack([g(f"{s}mlp.experts.{e}.down_proj.weight") for e in range(c.E)]),
         p + "ffn_gate_inp_shexp.weight": g(s + "mlp.shared_expert_gate.weight"),
         p + "ffn_gate_shexp.weight": g(s + "mlp.shared_expert.gate_proj.weight"),
         p + "ffn_up_shexp.weight": g(s + "mlp.shared_expert.up_proj.weight"),
         p + "ffn_down_shexp.weight": g(s + "mlp.shared_expert.down_proj.weight"),
         p + "nextn.eh_proj.weight": g("mtp.fc.weight"), p + "nextn.enorm.weight": 1 + g("mtp.pre_fc_norm_embedding.weight"),
         p + "nextn.hnorm.weight": 1 + g("mtp.pre_fc_norm_hidden.weight"),
         p + "nextn.shared_head_norm.weight": 1 + g("mtp.norm.weight")}
    return Model(c, W)


def run(tandem, workdir, tol, report, steps=32, margin_tol=1e-3):
    import transformers
    from safetensors.torch import load_file
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    gen = torch.Generator().manual_seed(1234)
    cfg = make_config()
    from transformers import Qwen3NextForCausalLM
    model = Qwen3NextForCausalLM(cfg).float().eval()
    randomize(model, gen)
    mtp = mtp_tensors(cfg, gen)
    section = {"transformers": transformers.__version__, "torch": torch.__version__, "dims": DIMS,
               "rope": ROPE, "tolerance": tol, "checkpoints": [], "ok": True}
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(0, 2990, size=n)] for n in (1, 6, 17, 40)]
    for label, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        d = os.path.join(workdir, f"hf-{label}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        keys = save_checkpoint(model, mtp, d, dtype)
        gguf = os.path.join(workdir, f"converted-{label}.gguf")
        conv = subprocess.run([tandem, "convert", "--hf", d, "--out", gguf, "--type", "f32", "--quiet"],
                              capture_output=True, text=True)
        entry = {"checkpoint": label, "expert_layout": "fused" if any("gate_up_proj" in k for k in keys) else "per-expert",
                 "convert_rc": conv.returncode, "convert_stderr": conv.stderr[-2000:], "prompts": [], "ok": conv.returncode == 0}
        section["checkpoints"].append(entry)
        if conv.returncode != 0:
            print(f"  {label}: tandem convert FAILED: {conv.stderr[-2000:]}", flush=True)
            section["ok"] = False
            continue
        hf = load_f32(d)
        # The same checkpoint in float64: says how much of an f32 difference is transformers' own
        # f32 rounding (its chunked GDN and softmaxes in f32) rather than a difference in the math.
        hf64 = load_f32(d, torch.float64)
        entry["experts_implementation"] = str(getattr(hf.config, "_experts_implementation", "unknown"))
        print(f"  {label}: transformers experts implementation: {entry['experts_implementation']}", flush=True)
        hf_state = {k: v.float() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
        captured = {}
        hf.model.norm.register_forward_hook(lambda mod, inp, out: captured.__setitem__("hsrc", out[0].detach().double()))
        mtp_ref = mtp_model(hf_state, cfg)
        for ids in prompts:
            t = tandem_logits(tandem, gguf, ids, workdir, greedy=steps, draft=3)
            with torch.no_grad():
                logits = hf(input_ids=torch.tensor([ids])).logits[0].double().numpy()
                hsrc = captured["hsrc"]
            errs = [rel_l2(t["logits"][p], logits[p]) for p in range(len(ids))]
            with torch.no_grad():
                logits64 = hf64(input_ids=torch.tensor([ids])).logits[0].double().numpy()
            errs64 = [rel_l2(t["logits"][p], logits64[p]) for p in range(len(ids))]
            hf32_vs_64 = [rel_l2(logits[p], logits64[p]) for p in range(len(ids))]
            toks64, _, rows64 = hf_greedy(hf64, ids, steps)
            first64 = next((j for j in range(steps) if toks64[j] != t["greedy"][j]), -1)
            path64 = [rel_l2(t["logits"][len(ids) - 1 + j], rows64[j])
                      for j in range(1, steps if first64 < 0 else first64)]
            toks, margins, rows = hf_greedy(hf, ids, steps)
            first = next((j for j in range(steps) if toks[j] != t["greedy"][j]), -1)
            path_errs = [rel_l2(t["logits"][len(ids) - 1 + j], rows[j]) for j in range(1, steps if first < 0 else first)]
            nxt = int(np.argmax(logits[-1]))
            drafts, dlog = mtp_ref.draft(ids, hsrc, nxt, 3)
            mtp_err = max(rel_l2(t["draft_logits"][j], dlog[j].numpy()) for j in range(3))
            e = {"length": len(ids), "max_rel_l2": max(errs), "greedy_path_max_rel_l2": max(path_errs, default=0.0),
                 "tandem_greedy": t["greedy"], "hf_greedy": toks, "first_difference": first,
                 "hf_top2_margin_at_difference": None if first < 0 else margins[first], "min_hf_top2_margin": min(margins),
                 "mtp_drafts_tandem": t["draft"], "mtp_drafts_torch": drafts, "mtp_max_rel_l2": mtp_err,
                 "f64_max_rel_l2": max(errs64), "f64_greedy_path_max_rel_l2": max(path64, default=0.0),
                 "f64_first_difference": first64, "hf_f32_vs_f64_max_rel_l2": max(hf32_vs_64)}
            e["ok"] = (e["max_rel_l2"] <= tol and e["greedy_path_max_rel_l2"] <= tol
                       and (first < 0 or margins[first] < margin_tol) and mtp_err <= tol
                       and drafts == t["draft"])
            entry["ok"] &= e["ok"]
            entry["prompts"].append(e)
            print(f"  {label}, {len(ids)} tokens: logits max rel L2 {e['max_rel_l2']:.2e}; greedy {steps}: "
                  + ("same" if first < 0 else f"differs at step {first} (HF top-2 margin {margins[first]:.2e})")
                  + f"; MTP rel L2 {mtp_err:.2e} drafts {'same' if drafts == t['draft'] else 'DIFFER'}"
                  + (" OK" if e["ok"] else " FAIL"), flush=True)
            print(f"    vs transformers in f64: logits max rel L2 {e['f64_max_rel_l2']:.2e} (greedy path "
                  f"{e['f64_greedy_path_max_rel_l2']:.2e}, first difference {first64}); transformers f32 vs "
                  f"f64 {e['hf_f32_vs_f64_max_rel_l2']:.2e}", flush=True)
        section["ok"] &= entry["ok"]
    report["transformers_parity"] = section
    return section["ok"]
