#!/usr/bin/env node
// llama.cpp's tokenization of many files with one model load (the tokenizer
// conformance test runs it once per vocabulary; reference.mjs loads the model per call).
//
//   node tokenizer_reference.mjs MODEL FILE...
//
// Prints one JSON object: {"files": {"<FILE>": {plain, special, detok_plain, detok_special}}}
//   plain          ids of the file's text, BOS/EOS added as the model's metadata says,
//                  special-token texts left as text   (llama_tokenize add_special, !parse_special)
//   special        the same with special-token texts parsed into their tokens
//   detok_plain    llama_detokenize(plain ids, remove_special = false, unparse_special = false)
//   detok_special  llama_detokenize(special ids, false, unparse_special = true)
// Files are read as UTF-8 (a JavaScript string), as reference.mjs reads them.

import fs from "node:fs";
import path from "node:path";
import process from "node:process";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const [modelPath, ...files] = process.argv.slice(2);
if (!modelPath || files.length === 0) {
  process.stderr.write("usage: node tokenizer_reference.mjs MODEL FILE...\n");
  process.exit(2);
}

const llama = await getLlama({
  gpu: false,
  build: "never",
  logLevel: LlamaLogLevel.error,
  logger: (level, message) => process.stderr.write(`llama.cpp [${level}]: ${message}\n`),
  progressLogs: false,
  maxThreads: 1,
});
const model = await llama.loadModel({ modelPath: path.resolve(modelPath), gpuLayers: 0, vocabOnly: true });

function withSpecial(tokens) {
  let out = Array.from(tokens);
  if (model.tokens.shouldPrependBosToken && model.tokens.bos != null) out = [model.tokens.bos, ...out];
  if (model.tokens.shouldAppendEosToken && model.tokens.eos != null) out = [...out, model.tokens.eos];
  return out;
}

const result = { files: {} };
for (const file of files) {
  const text = fs.readFileSync(file, "utf8");
  const plain = withSpecial(model.tokenize(text, false));
  const special = withSpecial(model.tokenize(text, true));
  result.files[file] = {
    plain,
    special,
    detok_plain: model.detokenize(plain, false),
    detok_special: model.detokenize(special, true),
  };
}
process.stdout.write(JSON.stringify(result) + "\n");
await model.dispose();
await llama.dispose();
