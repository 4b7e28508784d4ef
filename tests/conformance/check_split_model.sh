#!/usr/bin/env bash
# A model written split (pico mkmodel --split-max-tensors) is one model to pico and
# to llama.cpp: `pico inspect` on any part lists every tensor of the unsplit file,
# and llama.cpp's next-token distributions from the split files equal those from
# the unsplit file.
#   check_split_model.sh PICO NODE
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pico="$1"
node="$2"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/pico_split.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

options=(--arch llama --vocab llama2 --layers 3 --embd 64 --ff 128 --heads 4 --kv-heads 2 --seed 7)
"$pico" mkmodel "${options[@]}" -o "$tmp/whole.gguf"
"$pico" mkmodel "${options[@]}" --split-max-tensors 12 -o "$tmp/split.gguf"
parts=("$tmp"/split-0000?-of-00003.gguf)
[[ ${#parts[@]} -eq 3 ]] || fail "expected 3 split files, found: ${parts[*]}"

tensor_names() { "$pico" inspect -m "$1" --tensors | awk '/^ +[0-9]+  /{print $2}' | sort; }
whole_names="$(tensor_names "$tmp/whole.gguf")"
[[ -n "$whole_names" ]] || fail "no tensors listed for the unsplit model"
for part in "${parts[@]}"; do
  [[ "$(tensor_names "$part")" == "$whole_names" ]] || fail "pico inspect $(basename "$part") does not list the model's tensors"
done
summary="$("$pico" inspect -m "${parts[1]}" --kv)"
[[ "$summary" == *"3 file(s)"* ]] || fail "pico inspect does not report 3 files"

printf '%s' "Split models open as one model." >"$tmp/text.txt"
"$node" "$here/reference.mjs" tokenize "$tmp/whole.gguf" "$tmp/text.txt" >"$tmp/tokens.json"
"$node" "$here/reference.mjs" probs "$tmp/whole.gguf" "$tmp/tokens.json" --out "$tmp/whole.bin" >/dev/null
"$node" "$here/reference.mjs" probs "${parts[0]}" "$tmp/tokens.json" --out "$tmp/split.bin" >/dev/null
cmp -s "$tmp/whole.bin" "$tmp/split.bin" || fail "llama.cpp's distributions differ between the split and unsplit files"
echo "split model: $(echo "$whole_names" | wc -l) tensors in 3 files; pico inspect and llama.cpp agree with the unsplit file"
