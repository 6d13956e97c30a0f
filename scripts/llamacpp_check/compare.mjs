// Compares Tandem's CPU reference with llama.cpp (the CPU build bundled by the npm package
// node-llama-cpp) on one GGUF file: greedy continuations from token-id prompts, and the logits
// at every position of the same token sequence (teacher-forced), as relative L2 error.
//
//   node compare.mjs --model F.gguf --tandem build/gpu_service/tandem [--steps 16] [--out report.json]
//                    [--kv F32|F16]   (llama.cpp's KV cache type; default: llama.cpp's, F16)
//
// Run through run.sh, which installs node-llama-cpp outside the repository. Exit status 0 only
// when every prompt's greedy tokens agree for all steps.
import {execFileSync} from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

function parseArgs(argv) {
    const args = {steps: 16, out: "", model: "", tandem: "", tolerance: 1e-4, kv: ""};
    for (let i = 2; i < argv.length; i += 2) {
        const key = argv[i].replace(/^--/, "");
        if (!(key in args)) throw new Error(`unknown flag ${argv[i]}`);
        args[key] = typeof args[key] === "number" ? Number(argv[i + 1]) : argv[i + 1];
    }
    if (!args.model || !args.tandem) throw new Error("--model and --tandem are required");
    return args;
}

// Fixed prompts of token ids (all below 1000, so valid for any generated model's vocabulary).
const PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7, 8],
    [100, 37, 512, 9, 88, 300, 41, 7, 250, 19, 600, 3],
    [42],
    [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7],
    [900, 15, 311, 64, 128, 256, 512, 1, 2, 800, 5, 17, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71],
];

function tandemRun(tandem, model, ids, steps, tmp) {
    const out = path.join(tmp, "tandem_logits.bin");
    const line = execFileSync(tandem, ["logits", "--model", model, "--ids", ids.join(","),
        "--greedy", String(steps), "--out", out], {encoding: "utf8"});
    const meta = JSON.parse(line.trim().split("\n").pop());
    const buf = fs.readFileSync(out);
    const logits = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
    return {greedy: meta.greedy, vocab: meta.vocab, logits};
}

function relL2(a, b) {
    let num = 0, den = 0;
    for (let i = 0; i < a.length; ++i) {
        num += (a[i] - b[i]) ** 2;
        den += b[i] ** 2;
    }
    return Math.sqrt(num / Math.max(den, 1e-30));
}

function top2Margin(row) {
    let m1 = -Infinity, m2 = -Infinity;
    for (const x of row) {
        if (x > m1) { m2 = m1; m1 = x; } else if (x > m2) m2 = x;
    }
    return m1 - m2;
}

const args = parseArgs(process.argv);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tandem-llamacpp-"));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0});
const report = {model: args.model, steps: args.steps, kv_cache_type: args.kv || "default (F16)", prompts: [], llama_cpp_release: null, ok: true};
try {
    const {createRequire} = await import("node:module");
    const require = createRequire(import.meta.url);
    report.llama_cpp_release = require("node-llama-cpp/llama/llama.cpp.info.json").tag;
} catch { /* reported as null */ }

const kvOptions = args.kv ? {experimentalKvCacheKeyType: args.kv, experimentalKvCacheValueType: args.kv} : {};
// One thread: llama.cpp's worker threads spin while waiting, which on a busy 2-core machine made
// multi-threaded runs crawl.
const context = await model.createContext({contextSize: 256, sequences: 1, batchSize: 256, threads: 1, ...kvOptions});
const seq = context.getSequence();
for (const ids of PROMPTS) {
    const t = tandemRun(args.tandem, args.model, ids, args.steps, tmp);
    const V = t.vocab;

    // llama.cpp greedy continuation (one context for the whole run: creating and disposing one
    // per prompt has been seen to hang node-llama-cpp).
    await seq.clearHistory();
    const llamaGreedy = [];
    for await (const token of seq.evaluate(ids, {temperature: 0})) {
        llamaGreedy.push(token);
        if (llamaGreedy.length >= args.steps) break;
    }

    // llama.cpp logits at every position of ids + Tandem's greedy tokens (teacher-forced).
    const forced = ids.concat(t.greedy.slice(0, args.steps - 1));
    await seq.clearHistory();
    const outputs = await seq.controlledEvaluate(forced.map((tok) => [tok, {generateNext: {logits: true}}]));
    let worst = 0, worstPos = -1;
    const perPos = [];
    for (let p = 0; p < forced.length; ++p) {
        const map = outputs[p]?.next?.logits;
        if (!map) throw new Error(`llama.cpp returned no logits at position ${p}`);
        const row = new Float32Array(V);
        for (const [tok, v] of map) row[tok] = v;
        const ours = t.logits.subarray(p * V, (p + 1) * V);
        const err = relL2(row, ours);
        perPos.push(err);
        if (err > worst) { worst = err; worstPos = p; }
    }
    let firstDiff = -1;
    for (let j = 0; j < args.steps; ++j) {
        if (llamaGreedy[j] !== t.greedy[j]) { firstDiff = j; break; }
    }
    const margins = [];
    for (let j = 0; j < args.steps; ++j) {
        const p = ids.length - 1 + j;
        margins.push(top2Margin(t.logits.subarray(p * V, (p + 1) * V)));
    }
    const entry = {
        prompt: ids, tandem_greedy: t.greedy, llama_greedy: llamaGreedy,
        greedy_agree: firstDiff < 0, first_difference: firstDiff,
        tandem_top2_margin_at_difference: firstDiff < 0 ? null : margins[firstDiff],
        max_rel_l2_logits: worst, max_rel_l2_position: worstPos,
        min_top2_margin: Math.min(...margins),
    };
    if (firstDiff >= 0) report.ok = false;
    report.prompts.push(entry);
    console.log(`prompt of ${ids.length} ids: greedy ${firstDiff < 0 ? "agree" : "DIFFER at step " + firstDiff}` +
        ` (${args.steps} steps); logits max rel L2 ${worst.toExponential(2)} at position ${worstPos}` +
        `; min top-2 margin ${entry.min_top2_margin.toFixed(4)}`);
}
await context.dispose();
await model.dispose();
fs.rmSync(tmp, {recursive: true, force: true});
if (args.out) fs.writeFileSync(args.out, JSON.stringify(report, null, 1));
console.log(report.ok ? "RESULT: llama.cpp and Tandem agree on every prompt" : "RESULT: DISAGREEMENT");
process.exit(report.ok ? 0 : 1);
