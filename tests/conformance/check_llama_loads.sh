#!/usr/bin/env bash
# Makes a synthetic model with `pico mkmodel` and checks that llama.cpp (through
# reference.mjs) loads it and computes sane next-token distributions from it:
# finite, summing to 1, neither flat (max prob > 5/n_vocab) nor degenerate
# (max prob < 0.99). Fails, never skips, when node or node_modules is missing.
#
#   check_llama_loads.sh PICO NODE ARCH VOCAB [mkmodel options...]
#
# Prints llama.cpp's view of the model and, per position, the top token and its
# probability.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 4 ]]; then
  echo "usage: $0 PICO NODE ARCH VOCAB [mkmodel options...]" >&2
  exit 2
fi
pico="$1"
node="$2"
arch="$3"
vocab="$4"
shift 4

fail() {
  echo "FAIL ($arch/$vocab): $*" >&2
  exit 1
}

node_modules="${PICO_NODE_MODULES:-$here/node_modules}"
if [[ -z "$node" || "$node" == *NOTFOUND* || ! -x "$(command -v "$node" 2>/dev/null || echo "$node")" ]]; then
  fail "node not found (install Node.js 20+; scripts/setup.sh does)"
fi
if [[ ! -d "$node_modules/node-llama-cpp" ]]; then
  fail "$node_modules/node-llama-cpp is missing: run 'npm ci' in tests/conformance (scripts/setup.sh does)"
fi
[[ -x "$pico" ]] || fail "pico executable not found at '$pico'"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/pico_conformance.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
model="$tmp/model.gguf"

"$pico" mkmodel --arch "$arch" --vocab "$vocab" --node-modules "$node_modules" "$@" -o "$model" ||
  fail "pico mkmodel failed"
# With PICO_QUANTIZE=TYPE the model is first quantized by `pico quantize`, so that
# the check shows llama.cpp loads what pico's quantizer writes.
if [[ -n "${PICO_QUANTIZE:-}" ]]; then
  "$pico" quantize "$model" "$tmp/quantized.gguf" "$PICO_QUANTIZE" || fail "pico quantize $PICO_QUANTIZE failed"
  model="$tmp/quantized.gguf"
fi

info="$("$node" "$here/reference.mjs" info "$model")" || fail "llama.cpp did not load the model"
echo "llama.cpp info: $info"

printf '%s' "The quick brown fox jumps over the lazy dog. 1234 + 5678 = 6912; naïve café, 日本語のテキスト!" >"$tmp/text.txt"
tokens="$("$node" "$here/reference.mjs" tokenize "$model" "$tmp/text.txt")" || fail "llama.cpp could not tokenize"
echo "llama.cpp tokens: $tokens"
printf '%s' "$tokens" >"$tmp/tokens.json"

probs="$("$node" "$here/reference.mjs" probs "$model" "$tmp/tokens.json" --out "$tmp/probs.bin")" ||
  fail "llama.cpp could not evaluate the model"

greedy="$("$node" "$here/reference.mjs" greedy "$model" "$tmp/tokens.json" 4)" || fail "llama.cpp could not generate"
echo "llama.cpp greedy continuation: $greedy"

"$node" --input-type=module - "$arch" "$info" "$probs" "$greedy" <<'EOF' || fail "distribution check failed"
import fs from "node:fs";
const [arch, infoText, probsText, greedyText] = process.argv.slice(2);
const info = JSON.parse(infoText);
const probs = JSON.parse(probsText);
const greedy = JSON.parse(greedyText);
const problems = [];
if (info.arch !== arch) problems.push(`architecture ${info.arch}, expected ${arch}`);
if (info.n_vocab !== info.n_tokens_metadata) problems.push(`n_vocab ${info.n_vocab} != ${info.n_tokens_metadata} tokens in the metadata`);
if (Math.abs(info.first_token_prob_sum - 1) > 1e-2) problems.push(`info distribution sums to ${info.first_token_prob_sum}`);
const n = probs.n_vocab;
if (n !== info.n_vocab) problems.push(`probs n_vocab ${n} != info n_vocab ${info.n_vocab}`);
const buffer = fs.readFileSync(probs.out);
const rows = new Float32Array(buffer.buffer, buffer.byteOffset, buffer.byteLength / 4);
const count = probs.tokens.length;
if (rows.length !== count * n) problems.push(`${rows.length} probabilities, expected ${count} x ${n}`);
const lines = [];
let lastArgmax = -1;
for (let i = 0; i < count && rows.length === count * n; i++) {
  const row = rows.subarray(i * n, (i + 1) * n);
  let sum = 0, max = 0, argmax = -1, entropy = 0, bad = 0;
  for (let t = 0; t < n; t++) {
    const p = row[t];
    if (!Number.isFinite(p) || p < 0) { bad++; continue; }
    sum += p;
    if (p > max) { max = p; argmax = t; }
    if (p > 0) entropy -= p * Math.log(p);
  }
  if (bad) problems.push(`position ${i}: ${bad} non-finite or negative probabilities`);
  if (Math.abs(sum - 1) > 1e-3) problems.push(`position ${i}: probabilities sum to ${sum}`);
  if (!(max > 5 / n)) problems.push(`position ${i}: flat distribution (max ${max} <= 5/${n})`);
  // Ternary and binary quantization of random weights may sharpen a distribution
  // past 0.99; for quantized files only loading and sane numbers are checked.
  if (!process.env.PICO_QUANTIZE && !(max < 0.99)) problems.push(`position ${i}: degenerate distribution (max ${max})`);
  lastArgmax = argmax;
  lines.push(`  pos ${String(i).padStart(2)} token ${String(probs.tokens[i]).padStart(6)} -> top ${String(argmax).padStart(6)} ` +
             `p=${max.toFixed(4)} (${(max * n).toFixed(0)}x uniform) entropy ${entropy.toFixed(2)} nats (uniform ${Math.log(n).toFixed(2)})`);
}
if (!Array.isArray(greedy) || greedy.length !== 4) problems.push(`greedy gave ${greedyText}`);
else if (greedy[0] !== lastArgmax) problems.push(`greedy's first token ${greedy[0]} is not the argmax ${lastArgmax} of the last distribution`);
console.log(`llama.cpp next-token distributions (${arch}, n_vocab ${n}):\n${lines.join("\n")}`);
if (problems.length) {
  console.error(problems.join("\n"));
  process.exit(1);
}
EOF
echo "PASS ($arch/$vocab)"
