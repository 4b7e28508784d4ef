#!/usr/bin/env node
// llama.cpp's speed on a GGUF, measured the way `pico bench` measures pico's: the
// time to evaluate a prompt of P tokens in one batch (prefill), then the time to
// generate N tokens one by one greedily (decode). Prints one JSON line:
//   {"prefill_tps": ..., "decode_tps": ..., "prompt": P, "generated": N, "threads": T}
//
//   node llama_bench.mjs MODEL [-p 256] [-n 64] [-t 2] [--repeat 2] [--vulkan] [--mlock]
// The best of --repeat runs is reported (the machines are noisy). Prompt tokens are
// a fixed pseudo-random sequence of ordinary tokens (no BOS), the same pico bench uses.
// --vulkan: llama.cpp's Vulkan build (@node-llama-cpp/linux-x64-vulkan, which
// scripts/bench-vulkan installs) with every layer on the first Vulkan device.
import path from "node:path";
import process from "node:process";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? Number.parseInt(args[i + 1], 10) : fallback;
};
const modelPath = args.find((a, i) => !a.startsWith("-") && (i === 0 || !args[i - 1].startsWith("-")));
if (!modelPath) {
  process.stderr.write("usage: node llama_bench.mjs MODEL [-p 256] [-n 64] [-t 2] [--repeat 2] [--vulkan]\n");
  process.exit(2);
}
const promptLength = option("-p", 256);
const generate = option("-n", 64);
const threads = option("-t", 2);
const repeat = option("--repeat", 2);
const vulkan = args.includes("--vulkan");
const mlock = args.includes("--mlock");  // lock the model's memory (llama.cpp's --mlock)

// The prompt: token i = 1000 + (i * 7919) mod (n_vocab - 2000), as pico bench makes it.
function benchPrompt(nVocab, n) {
  const tokens = [];
  for (let i = 0; i < n; i++) tokens.push(1000 + ((i * 7919) % (nVocab - 2000)));
  return tokens;
}

const llama = await getLlama({ gpu: vulkan ? "vulkan" : false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false, maxThreads: threads });
if (vulkan && llama.gpu !== "vulkan") throw new Error("llama.cpp's Vulkan build did not load (got " + llama.gpu + ")");
const model = await llama.loadModel({ modelPath: path.resolve(modelPath), gpuLayers: vulkan ? "max" : 0, useMmap: true, useMlock: mlock });
const nVocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length ?? 32000;
const prompt = benchPrompt(nVocab, promptLength);

let bestPrefill = 0;
let bestDecode = 0;
for (let r = 0; r < repeat; r++) {
  const context = await model.createContext({
    contextSize: Math.ceil((promptLength + generate + 16) / 256) * 256,
    batchSize: promptLength,
    sequences: 1,
    threads,
  });
  const sequence = context.getSequence();
  let start = process.hrtime.bigint();
  await sequence.evaluateWithoutGeneratingNewTokens(prompt);
  const prefillSeconds = Number(process.hrtime.bigint() - start) / 1e9;

  start = process.hrtime.bigint();
  let count = 0;
  // Greedy generation one token at a time; the first evaluate call feeds the last
  // prompt token again, so time the steps after the first token is out.
  for await (const token of sequence.evaluate([prompt[prompt.length - 1]], { temperature: 0 })) {
    void token;
    if (count === 0) start = process.hrtime.bigint();
    if (++count > generate) break;
  }
  const decodeSeconds = Number(process.hrtime.bigint() - start) / 1e9;
  bestPrefill = Math.max(bestPrefill, promptLength / prefillSeconds);
  bestDecode = Math.max(bestDecode, generate / decodeSeconds);
  await context.dispose();
}
process.stdout.write(JSON.stringify({ prefill_tps: bestPrefill, decode_tps: bestDecode, prompt: promptLength, generated: generate, threads, backend: vulkan ? "vulkan" : "cpu" }) + "\n");
await model.dispose();
