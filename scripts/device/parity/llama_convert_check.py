"""Optional: llama.cpp's own converter (convert_hf_to_gguf.py from a llama.cpp source tree) on the
same HF checkpoint, compared with `tandem convert`'s output: tensor names, shapes, types, metadata
keys and values, and (both F32) tensor data. Needs LLAMA_CPP_DIR (its gguf-py is used)."""
import os
import subprocess
import sys

import numpy as np

from gguf_read import read_gguf

# llama.cpp's converter hashes the tokenizer's output to name the pre-tokenizer; the hand-made test
# tokenizer is unknown to it, so it is told "qwen2", what Qwen3-Next's real tokenizer hashes to.
WRAPPER = """
import sys
sys.argv = [sys.argv[0]] + sys.argv[1:]
sys.path.insert(0, {src!r}); sys.path.insert(0, {src!r} + '/gguf-py')
import runpy, conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'
runpy.run_path({src!r} + '/convert_hf_to_gguf.py', run_name='__main__')
"""


def run(hf_dir, ours, workdir, report):
    src = os.environ.get("LLAMA_CPP_DIR", "")
    section = {"llama_cpp_dir": src}
    report["llama_cpp_converter"] = section
    if not src or not os.path.exists(os.path.join(src, "convert_hf_to_gguf.py")):
        section["skipped"] = "LLAMA_CPP_DIR (a llama.cpp source tree) not given"
        print("  llama.cpp converter comparison skipped (no LLAMA_CPP_DIR)")
        return True
    theirs = os.path.join(workdir, "llama-converted.gguf")
    wrapper = os.path.join(workdir, "llama_convert_wrapper.py")
    with open(wrapper, "w") as f:
        f.write(WRAPPER.format(src=src))
    r = subprocess.run([sys.executable, wrapper, hf_dir, "--outfile", theirs, "--outtype", "f32"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        section["skipped"] = "convert_hf_to_gguf.py failed: " + r.stderr[-1500:]
        print("  llama.cpp converter failed:", r.stderr[-400:])
        return True
    m1, t1 = read_gguf(ours)
    m2, t2 = read_gguf(theirs)
    section["tensors_only_tandem"] = sorted(set(t1) - set(t2))
    section["tensors_only_llama"] = sorted(set(t2) - set(t1))
    diffs = []
    for name in sorted(set(t1) & set(t2)):
        a, b = t1[name].numpy(), t2[name].numpy()
        if a.size != b.size:
            diffs.append(f"{name}: shape {list(a.shape)} vs {list(b.shape)}")
        elif not np.array_equal(a.reshape(-1), b.reshape(-1)):
            diffs.append(f"{name}: max |diff| {float(np.max(np.abs(a.reshape(-1) - b.reshape(-1)))):.3g}")
    section["tensor_differences"] = diffs
    skip = {"general.name", "general.file_type", "general.quantization_version", "tokenizer.chat_template"}
    section["keys_only_tandem"] = sorted(k for k in set(m1) - set(m2) if k not in skip)
    section["keys_only_llama"] = sorted(k for k in set(m2) - set(m1) if k not in skip and not k.startswith("general."))
    section["value_differences"] = sorted(k for k in set(m1) & set(m2) if k not in skip and m1[k] != m2[k])
    # Where each differing value first differs (for arrays: the index, the count and both values).
    details = {}
    for k in section["value_differences"]:
        a, b = m1[k], m2[k]
        if isinstance(a, list) and isinstance(b, list):
            idx = [i for i in range(min(len(a), len(b))) if a[i] != b[i]]
            details[k] = {"len_tandem": len(a), "len_llama": len(b), "n_differ": len(idx),
                          "first": [(i, repr(a[i]), repr(b[i])) for i in idx[:5]]}
        else:
            details[k] = {"tandem": repr(a)[:200], "llama": repr(b)[:200]}
    section["value_difference_details"] = details
    ok = not (section["tensors_only_tandem"] or section["tensors_only_llama"] or diffs or section["value_differences"])
    section["ok"] = ok
    print(f"  llama.cpp converter: {len(t2)} tensors; differences: {len(diffs)} data, "
          f"{len(section['tensors_only_tandem'])}+{len(section['tensors_only_llama'])} names, "
          f"{len(section['value_differences'])} metadata values" + (" OK" if ok else " (see report)"))
    return ok
