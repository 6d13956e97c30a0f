"""Tandem parity checks for the GPU machine (docs/VALIDATION.md): transformers parity on a random
Qwen3-Next (f32 and bf16 checkpoints, with an MTP head), llama.cpp's converter (optional), and
the qwen4exp-only blocks against an independent PyTorch implementation of docs/MODEL.md.

  python3 parity.py --tandem BUILD/gpu_service/tandem --out DIR [--skip-hf]

Writes DIR/parity_report.json and DIR/parity_report.md; exit status 0 only when every check passed.
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import q4x_check  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--skip-hf", action="store_true", help="only the qwen4exp blocks (no transformers needed)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import torch
    report = {"python": platform.python_version(), "torch": torch.__version__, "tolerance": args.tolerance,
              "tandem": os.path.abspath(args.tandem)}
    ok = True
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="tandem-parity-") as work:
        print("qwen4exp blocks (streams, Engram, indexer, MTP) vs independent PyTorch:", flush=True)
        try:
            ok &= q4x_check.run(args.tandem, work, args.tolerance, report)
        except Exception:
            report["qwen4exp_blocks_error"] = traceback.format_exc()
            print(report["qwen4exp_blocks_error"])
            ok = False
        if not args.skip_hf:
            print("transformers parity (random Qwen3NextForCausalLM):", flush=True)
            try:
                import hf_check
                ok &= hf_check.run(args.tandem, work, args.tolerance, report)
                import llama_convert_check
                ok &= llama_convert_check.run(os.path.join(work, "hf-f32"), os.path.join(work, "converted-f32.gguf"),
                                              work, report)
            except Exception:
                report["transformers_parity_error"] = traceback.format_exc()
                print(report["transformers_parity_error"])
                ok = False
    report["seconds"] = round(time.time() - start, 1)
    report["ok"] = bool(ok)
    with open(os.path.join(args.out, "parity_report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(args.out, "parity_report.md"), "w") as f:
        f.write(summary(report))
    print(summary(report))
    return 0 if ok else 1


def summary(r):
    lines = [f"# Tandem parity report: {'PASS' if r['ok'] else 'FAIL'}", "",
             f"python {r['python']}, torch {r['torch']}, tolerance {r['tolerance']} (relative L2), {r['seconds']} s", ""]
    q = r.get("qwen4exp_blocks")
    if q:
        lines.append(f"## qwen4exp blocks ({q['model']}; S={q['streams']}, indexer {q['indexer']}, Engram layers {q['engram_layers']})")
        for p in q["prompts"]:
            lines.append(f"- {p['length']} tokens: logits max rel L2 {p['max_rel_l2']:.2e}"
                         + (f"; MTP drafts {p['drafts_tandem']} (torch {p['drafts_torch']}), rel L2 {p['mtp_max_rel_l2']:.2e}"
                            if "mtp_max_rel_l2" in p else "") + (" OK" if p["ok"] else " FAIL"))
        if "indexer_effect" in q:
            lines.append(f"- dense attention instead of the indexer would differ by rel L2 {q['indexer_effect']:.2e} "
                         "(so the sparse selection is exercised)")
        lines.append("")
    t = r.get("transformers_parity")
    if t:
        lines.append(f"## transformers {t['transformers']} parity")
        for c in t["checkpoints"]:
            lines.append(f"### {c['checkpoint']} checkpoint ({c['expert_layout']} experts): {'OK' if c['ok'] else 'FAIL'}")
            if c["convert_rc"]:
                lines.append("convert failed: " + c["convert_stderr"])
            for p in c["prompts"]:
                g = "same 32 tokens" if p["first_difference"] < 0 else \
                    f"differ at step {p['first_difference']} (HF top-2 margin {p['hf_top2_margin_at_difference']:.2e})"
                lines.append(f"- {p['length']} tokens: logits max rel L2 {p['max_rel_l2']:.2e} (along the greedy path "
                             f"{p['greedy_path_max_rel_l2']:.2e}); greedy {g}; min HF margin {p['min_hf_top2_margin']:.2e}; "
                             f"MTP rel L2 {p['mtp_max_rel_l2']:.2e}, drafts {p['mtp_drafts_tandem']} vs {p['mtp_drafts_torch']}")
                if "f64_max_rel_l2" in p:
                    lines.append(f"  - vs transformers in f64: logits max rel L2 {p['f64_max_rel_l2']:.2e} (greedy path "
                                 f"{p['f64_greedy_path_max_rel_l2']:.2e}); transformers f32 vs f64: "
                                 f"{p['hf_f32_vs_f64_max_rel_l2']:.2e}")
        lines.append("")
    l = r.get("llama_cpp_converter")
    if l:
        lines.append("## llama.cpp converter vs tandem convert")
        lines.append(json.dumps(l, indent=1))
    for k in ("qwen4exp_blocks_error", "transformers_parity_error"):
        if k in r:
            lines += [f"## {k}", "```", r[k], "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
