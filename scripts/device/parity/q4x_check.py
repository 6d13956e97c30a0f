"""qwen4exp-only blocks (streams §4.1, Engram §4.3, sparse indexer §4.5) and the MTP head (§4.7):
Tandem's CPU reference against model_torch.py on a generated `tiny` model with F32 weights."""
import json
import os
import subprocess

import numpy as np
import torch

from gguf_read import read_gguf
from model_torch import Config, Model


def rel_l2(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def tandem_logits(tandem, model, ids, workdir, greedy=0, draft=0):
    out = os.path.join(workdir, "tandem_logits.bin")
    cmd = [tandem, "logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out]
    if greedy:
        cmd += ["--greedy", str(greedy)]
    if draft:
        cmd += ["--draft", str(draft), "--draft-out", out + ".draft"]
    meta = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    V = meta["vocab"]
    meta["logits"] = np.fromfile(out, dtype=np.float32).reshape(-1, V)
    if draft:
        meta["draft_logits"] = np.fromfile(out + ".draft", dtype=np.float32).reshape(-1, V)
    return meta


def run(tandem, workdir, tol, report):
    path = os.path.join(workdir, "tiny-f32.gguf")
    subprocess.run([tandem, "gen-model", "--preset", "tiny", "--experts-type", "f32", "--dense-type", "f32",
                    "--head-type", "f32", "--out", path, "--quiet"], check=True)
    meta, W = read_gguf(path)
    cfg = Config(meta, W)
    model = Model(cfg, W)
    rng = np.random.default_rng(11)
    # Long enough for sparse selection: it starts at (keep + 1)·cr.
    first_sparse = (cfg.keep + 1) * cfg.cr if cfg.ih else 0
    prompts = [list(rng.integers(0, cfg.V, size=n)) for n in (7, 23, max(first_sparse + 20, 48))]
    section = {"model": "tiny (qwen4exp) F32", "streams": cfg.S, "indexer": [cfg.ih, cfg.di, cfg.cr, cfg.keep],
               "engram_layers": cfg.engram_layers, "first_sparse_position": first_sparse, "prompts": [], "ok": True}
    for ids in prompts:
        ids = [int(t) for t in ids]
        t = tandem_logits(tandem, path, ids, workdir, draft=3 if cfg.nextn else 0)
        with torch.no_grad():
            logits, hsrc = model.forward(ids)
            errs = [rel_l2(t["logits"][p], logits[p].numpy()) for p in range(len(ids))]
            entry = {"length": len(ids), "max_rel_l2": max(errs), "worst_position": int(np.argmax(errs))}
            if cfg.nextn:
                nxt = int(torch.argmax(logits[-1]))
                drafts, dlog = model.draft(ids, hsrc, nxt, 3)
                entry.update({"draft_next_torch": nxt, "draft_next_tandem": t["draft_next"],
                              "drafts_torch": drafts, "drafts_tandem": t["draft"],
                              "mtp_max_rel_l2": max(rel_l2(t["draft_logits"][j], dlog[j].numpy()) for j in range(3))})
                entry["ok_mtp"] = entry["mtp_max_rel_l2"] <= tol and drafts == t["draft"] and nxt == t["draft_next"]
        entry["ok"] = entry["max_rel_l2"] <= tol and entry.get("ok_mtp", True)
        section["ok"] &= entry["ok"]
        section["prompts"].append(entry)
        print(f"  q4x tiny, {len(ids)} tokens: logits max rel L2 {entry['max_rel_l2']:.2e}"
              + (f", MTP drafts {entry['drafts_tandem']} vs {entry['drafts_torch']}, rel L2 {entry['mtp_max_rel_l2']:.2e}"
                 if cfg.nextn else "") + (" OK" if entry["ok"] else " FAIL"), flush=True)
    if cfg.ih:
        # The same model with dense attention must differ past the first sparse position, or the
        # check above did not exercise the selection.
        ids = [int(t) for t in prompts[-1]]
        t = tandem_logits(tandem, path, ids, workdir)
        ih, cfg.ih = cfg.ih, 0
        with torch.no_grad():
            dense, _ = model.forward(ids)
        cfg.ih = ih
        section["indexer_effect"] = max(rel_l2(t["logits"][p], dense[p].numpy()) for p in range(first_sparse, len(ids)))
        section["ok"] &= section["indexer_effect"] > 10 * tol
        print(f"  dense attention instead of the indexer: rel L2 {section['indexer_effect']:.2e} (must be large)")
    report["qwen4exp_blocks"] = section
    return section["ok"]
