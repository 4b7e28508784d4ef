#!/usr/bin/env node
// llama.cpp reference harness: runs a GGUF through llama.cpp (node-llama-cpp's
// prebuilt CPU binaries, tests/conformance/node_modules) and prints what pico is
// compared against. Works from any working folder.
//
//   node reference.mjs info     MODEL
//       {n_vocab, n_ctx_train, n_embd, arch, name, vocab_type, bos, eos, add_bos, add_eos}
//   node reference.mjs tokenize MODEL TEXTFILE [--special] [--no-bos]
//       [ids...]: llama.cpp's tokenization of the file's text (UTF-8, used as is), with
//       BOS/EOS added as the model's metadata says unless --no-bos; --special parses
//       special-token texts ("<|im_start|>") into their tokens.
//   node reference.mjs probs    MODEL TOKENS_JSON [--top K] [--out FILE.bin]
//       (evaluated in batches of 64 tokens, one after the other)
//       The next-token distribution after every input token (softmax of the raw
//       logits, temperature 1, no sampler in between; renormalized in double
//       precision, as node-llama-cpp's own float normalization is off by up to 1e-3):
//         {n_vocab, tokens, probs: [[p(0), ..., p(n_vocab-1)], ...]}    (one row per token)
//         --top K: {n_vocab, tokens, top: [[[id, p], ...K], ...]} instead of full rows
//         --out F: writes the rows as raw little-endian float32 (n_tokens x n_vocab) to F
//                  and prints {n_vocab, tokens, out, max_prob: [...]} (for big vocabularies)
//   node reference.mjs greedy   MODEL TOKENS_JSON N
//       [ids...]: N tokens generated greedily (argmax) after the input.
//   node reference.mjs embed    MODEL TOKENS_JSON
//       {tokens, embedding}: node-llama-cpp's embedding of the tokens (the tokens it
//       evaluated: its embedding context adds the model's BOS and end token where the
//       vocabulary wants them). For a model without a pooling type that is the last
//       token's hidden state after the output norm, not normalised.
//
// TOKENS_JSON is a JSON array of token ids, either inline ("[1, 2, 3]") or a file.
// Common options: --threads N (default 2), --kv-type f32|f16 (KV cache type, default
// f32 so that the reference is not rounded through f16; llama.cpp's own default is f16).

import fs from "node:fs";
import path from "node:path";
import process from "node:process";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function usage(message) {
  if (message) process.stderr.write(`reference.mjs: ${message}\n`);
  process.stderr.write(
    "usage: node reference.mjs info MODEL\n" +
      "       node reference.mjs tokenize MODEL TEXTFILE [--special] [--no-bos]\n" +
      "       node reference.mjs probs MODEL TOKENS_JSON [--top K] [--out FILE.bin]\n" +
      "       node reference.mjs greedy MODEL TOKENS_JSON N\n" +
      "       node reference.mjs embed MODEL TOKENS_JSON\n" +
      "options: --threads N (default 2), --kv-type f32|f16 (default f32)\n",
  );
  process.exit(2);
}

function parseArgs(argv) {
  const positional = [];
  const options = { threads: 2, special: false, noBos: false, top: 0, out: null, kvType: "f32" };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === "--threads") options.threads = Number.parseInt(value(), 10);
    else if (arg === "--special") options.special = true;
    else if (arg === "--no-bos") options.noBos = true;
    else if (arg === "--top") options.top = Number.parseInt(value(), 10);
    else if (arg === "--out") options.out = value();
    else if (arg === "--kv-type") options.kvType = value().toLowerCase();
    else if (arg === "-h" || arg === "--help") usage();
    else if (arg.startsWith("--")) usage(`unknown option ${arg}`);
    else positional.push(arg);
  }
  if (!Number.isInteger(options.threads) || options.threads < 1) usage("--threads must be a positive integer");
  if (!["f32", "f16"].includes(options.kvType)) usage("--kv-type must be f32 or f16");
  return { positional, options };
}

function readTokens(arg) {
  const text = arg.trimStart().startsWith("[") ? arg : fs.readFileSync(arg, "utf8");
  const tokens = JSON.parse(text);
  if (!Array.isArray(tokens) || tokens.length === 0 || !tokens.every((t) => Number.isInteger(t) && t >= 0)) {
    throw new Error("TOKENS_JSON must be a non-empty JSON array of token ids");
  }
  return tokens;
}

async function loadModel(modelPath, options, { vocabOnly = false } = {}) {
  if (!fs.existsSync(modelPath)) throw new Error(`no such model file: ${modelPath}`);
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.error,
    logger: (level, message) => process.stderr.write(`llama.cpp [${level}]: ${message}${message.endsWith("\n") ? "" : "\n"}`),
    progressLogs: false,
    maxThreads: options.threads,
  });
  const model = await llama.loadModel({ modelPath: path.resolve(modelPath), gpuLayers: 0, vocabOnly, useMmap: true });
  return { llama, model };
}

async function createSequence(model, options, nTokens, batchSize = nTokens) {
  // Round the context up; llama.cpp pads it to a multiple of 256 anyway.
  const contextSize = Math.max(256, Math.ceil((nTokens + 8) / 256) * 256);
  const kvType = options.kvType === "f32" ? "F32" : "F16";
  const context = await model.createContext({
    contextSize,
    batchSize: Math.max(batchSize, 1),
    sequences: 1,
    threads: options.threads,
    flashAttention: false,
    swaFullCache: true,
    experimentalKvCacheKeyType: kvType,
    experimentalKvCacheValueType: kvType,
    ignoreMemorySafetyChecks: true,
  });
  return { context, sequence: context.getSequence() };
}

// The sum of a distribution, in double precision. node-llama-cpp normalizes with a
// float sum, which is off by up to ~1e-3 over a large vocabulary; dividing by this
// sum makes each probability the softmax of its logit to float precision.
function mapSum(map) {
  let sum = 0;
  for (const p of map.values()) sum += p;
  return sum;
}

// Probabilities map (token -> p, sorted by p) into a dense, renormalized row by token id.
function denseRow(map, nVocab) {
  const row = new Float32Array(nVocab);
  const sum = mapSum(map);
  for (const [token, p] of map) {
    if (token >= nVocab) throw new Error(`token ${token} outside the vocabulary (${nVocab})`);
    row[token] = p / sum;
  }
  return row;
}

// Nine significant digits: enough for a float32 to read back exactly.
function compactNumber(p) {
  if (p === 0) return "0";
  return Number(p.toPrecision(9)).toString();
}

async function commandInfo(modelPath, options) {
  const { model } = await loadModel(modelPath, options);
  const meta = model.fileInfo.metadata;
  // n_vocab as llama.cpp sees it: the size of one evaluated distribution.
  const bos = model.tokens.bos;
  const first = bos ?? 0;
  const { sequence } = await createSequence(model, options, 1);
  const [out] = await sequence.controlledEvaluate([[first, { generateNext: { probabilities: true } }]]);
  const probs = out?.next?.probabilities;
  if (!probs) throw new Error("llama.cpp returned no distribution");
  const sum = mapSum(probs);  // as node-llama-cpp normalized it: 1 to about 1e-3
  const arch = meta?.general?.architecture;
  const result = {
    n_vocab: probs.size,
    n_ctx_train: model.trainContextSize,
    n_embd: model.embeddingVectorSize,
    arch,
    name: meta?.general?.name ?? null,
    vocab_type: model.vocabularyType,
    bos: bos ?? null,
    eos: model.tokens.eos ?? null,
    add_bos: model.tokens.shouldPrependBosToken,
    add_eos: model.tokens.shouldAppendEosToken,
    n_tokens_metadata: meta?.tokenizer?.ggml?.tokens?.length ?? null,
    first_token_prob_sum: sum,
  };
  process.stdout.write(JSON.stringify(result) + "\n");
}

async function commandTokenize(modelPath, textFile, options) {
  const { model } = await loadModel(modelPath, options, { vocabOnly: true });
  const text = fs.readFileSync(textFile, "utf8");
  let tokens = model.tokenize(text, options.special);
  if (!options.noBos) {
    if (model.tokens.shouldPrependBosToken && model.tokens.bos != null) tokens = [model.tokens.bos, ...tokens];
    if (model.tokens.shouldAppendEosToken && model.tokens.eos != null) tokens = [...tokens, model.tokens.eos];
  }
  process.stdout.write(JSON.stringify(Array.from(tokens)) + "\n");
}

// Evaluates `tokens` in chunks of kChunk (one batch each), yielding the distribution
// after each token as soon as its chunk is done, so that long inputs over big
// vocabularies do not hold every Map at once.
const kChunk = 64;
async function* distributions(sequence, tokens) {
  for (let start = 0; start < tokens.length; start += kChunk) {
    const part = tokens.slice(start, start + kChunk);
    const results = await sequence.controlledEvaluate(part.map((t) => [t, { generateNext: { probabilities: true } }]));
    for (let i = 0; i < part.length; i++) {
      const map = results[i]?.next?.probabilities;
      if (!map) throw new Error(`no distribution for position ${start + i}`);
      yield map;
    }
  }
}

async function commandProbs(modelPath, tokens, options) {
  const { model } = await loadModel(modelPath, options);
  const { sequence } = await createSequence(model, options, tokens.length, Math.min(tokens.length, kChunk));
  // Each row as soon as it comes: dense (renormalized) or its top K.
  const rows = [];
  const tops = [];
  const maxProb = [];
  let nVocab = -1;
  let fd = null;
  try {
    if (options.out) fd = fs.openSync(options.out, "w");
    let i = 0;
    for await (const map of distributions(sequence, tokens)) {
      if (nVocab < 0) nVocab = map.size;
      if (map.size !== nVocab) throw new Error(`position ${i}: ${map.size} probabilities, expected ${nVocab}`);
      const sum = mapSum(map);
      maxProb.push(map.values().next().value / sum);
      if (options.top > 0 && !fd) {
        const pairs = [];
        for (const [token, p] of map) {
          if (pairs.length >= options.top) break;
          pairs.push(`[${token},${compactNumber(p / sum)}]`);
        }
        tops.push(`[${pairs.join(",")}]`);
      } else {
        const row = denseRow(map, nVocab);
        if (fd !== null) fs.writeSync(fd, Buffer.from(row.buffer, row.byteOffset, row.byteLength));  // x86/arm: little-endian
        else rows.push(row);
      }
      i++;
    }
  } finally {
    if (fd !== null) fs.closeSync(fd);
  }

  if (options.out) {
    process.stdout.write(JSON.stringify({ n_vocab: nVocab, tokens, out: path.resolve(options.out), max_prob: maxProb }) + "\n");
    return;
  }
  if (options.top > 0) {
    process.stdout.write(`{"n_vocab":${nVocab},"tokens":${JSON.stringify(tokens)},"top":[${tops.join(",")}]}\n`);
    return;
  }
  // Full rows, written piecewise (a row of 262k numbers is megabytes of text).
  process.stdout.write(`{"n_vocab":${nVocab},"tokens":${JSON.stringify(tokens)},"probs":[`);
  rows.forEach((row, r) => {
    const parts = new Array(nVocab);
    for (let t = 0; t < nVocab; t++) parts[t] = compactNumber(row[t]);
    process.stdout.write(`${r ? "," : ""}[${parts.join(",")}]`);
  });
  process.stdout.write("]}\n");
}

async function commandGreedy(modelPath, tokens, count, options) {
  const { model } = await loadModel(modelPath, options);
  const { sequence } = await createSequence(model, options, tokens.length + count);
  const generated = [];
  let input = tokens.map((t, i) => (i === tokens.length - 1 ? [t, { generateNext: { token: true } }] : t));
  while (generated.length < count) {
    const results = await sequence.controlledEvaluate(input);
    const next = results[input.length - 1]?.next?.token;
    if (next == null) throw new Error(`no token generated at step ${generated.length}`);
    generated.push(next);
    input = [[next, { generateNext: { token: true } }]];
  }
  process.stdout.write(JSON.stringify(generated) + "\n");
}

async function commandEmbed(modelPath, tokens, options) {
  const { model } = await loadModel(modelPath, options);
  const contextSize = Math.max(256, Math.ceil((tokens.length + 8) / 256) * 256);
  const context = await model.createEmbeddingContext({
    contextSize,
    batchSize: contextSize,
    threads: options.threads,
    ignoreMemorySafetyChecks: true,
  });
  const evaluated = [...tokens];
  context._prepareInput(evaluated);  // what getEmbeddingFor evaluates
  const embedding = await context.getEmbeddingFor(tokens);
  process.stdout.write(
    `{"tokens": ${JSON.stringify(evaluated)}, "embedding": [${embedding.vector.map(compactNumber).join(", ")}]}\n`,
  );
}

async function main() {
  const { positional, options } = parseArgs(process.argv.slice(2));
  const [command, modelPath, ...rest] = positional;
  if (!command) usage();
  if (!modelPath) usage("MODEL is required");
  switch (command) {
    case "info":
      return commandInfo(modelPath, options);
    case "tokenize":
      if (rest.length !== 1) usage("tokenize needs MODEL TEXTFILE");
      return commandTokenize(modelPath, rest[0], options);
    case "probs":
      if (rest.length !== 1) usage("probs needs MODEL TOKENS_JSON");
      return commandProbs(modelPath, readTokens(rest[0]), options);
    case "greedy": {
      if (rest.length !== 2) usage("greedy needs MODEL TOKENS_JSON N");
      const count = Number.parseInt(rest[1], 10);
      if (!Number.isInteger(count) || count < 1) usage("N must be a positive integer");
      return commandGreedy(modelPath, readTokens(rest[0]), count, options);
    }
    case "embed":
      if (rest.length !== 1) usage("embed needs MODEL TOKENS_JSON");
      return commandEmbed(modelPath, readTokens(rest[0]), options);
    default:
      usage(`unknown command ${command}`);
  }
}

// stdout to a pipe is asynchronous: wait until everything written is flushed before
// exiting (process.exit would cut long outputs short; without it the llama.cpp
// threads would keep the process alive).
function flushThenExit(code) {
  process.stdout.write("", () => process.exit(code));
}

main().then(
  () => flushThenExit(0),
  (error) => {
    process.stderr.write(`reference.mjs: ${error?.stack ?? error}\n`);
    flushThenExit(1);
  },
);
