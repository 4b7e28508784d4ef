#!/usr/bin/env bash
# `pico tokenize` / `pico detokenize` against llama.cpp (reference.mjs) through the
# command line: for each vocabulary given, makes a synthetic model, tokenizes a
# corpus file with and without --special, and checks that pico's JSON ids equal
# llama.cpp's and that detokenizing the --no-bos ids gives the file back.
# (tokenizer_conformance_test covers the whole corpus in-process; this checks the CLI.)
#
#   check_tokenize_cli.sh PICO NODE VOCAB...
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 3 ]]; then
  echo "usage: $0 PICO NODE VOCAB..." >&2
  exit 2
fi
pico="$1"
node="$2"
shift 2

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
text="$here/tokenizer_corpus/chat_formatted.txt"

normalize() { tr -d ' \n'; }

for vocab in "$@"; do
  model="$work/$vocab.gguf"
  "$pico" mkmodel --arch llama --vocab "$vocab" --layers 1 --embd 32 --ff 64 --heads 2 --kv-heads 1 -o "$model" >/dev/null
  for special in "" "--special"; do
    want="$("$node" "$here/reference.mjs" tokenize "$model" "$text" $special | normalize)"
    got="$("$pico" tokenize -m "$model" -f "$text" --ids $special | normalize)"
    if [[ "$got" != "$want" ]]; then
      echo "FAIL ($vocab ${special:-plain}): pico $got" >&2
      echo "                      llama.cpp $want" >&2
      exit 1
    fi
    echo "ok   $vocab ${special:-plain}: $(echo "$got" | tr ',' '\n' | wc -l) tokens"
  done
  ids="$("$pico" tokenize -m "$model" -f "$text" --ids --no-bos | tr -d '[] \n')"
  if ! cmp -s <("$pico" detokenize -m "$model" --ids "$ids") "$text"; then
    echo "FAIL ($vocab): detokenize(tokenize(text)) differs from the text" >&2
    exit 1
  fi
  echo "ok   $vocab round trip"
done
