#!/usr/bin/env bash
# pico template: the model's chat template is recognised from its metadata, a named
# one overrides it, and bad input is refused with a message (exit 1, no crash).
#   check_template.sh PICO
set -euo pipefail
pico="$1"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/pico_template.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$pico" mkmodel --arch qwen3 --vocab qwen3 -o "$tmp/qwen3.gguf" 2>/dev/null
printf '%s' '[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Bye"}]' >"$tmp/messages.json"

# Qwen3's template (from tokenizer.chat_template): ChatML; the answer before the last
# question has no reasoning, the generation prompt opens no think block.
expected=$'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n'
actual="$("$pico" template -m "$tmp/qwen3.gguf" --messages "$tmp/messages.json"; printf x)"
[[ "${actual%x}" == "$expected" ]] || fail "Qwen3 rendering differs: [${actual%x}]"
name="$("$pico" template -m "$tmp/qwen3.gguf" --messages "$tmp/messages.json" --show-name 2>&1 >/dev/null)"
[[ "$name" == "chat template: qwen3" ]] || fail "expected the qwen3 format, got: $name"

# --chat-template overrides: Llama 3's headers.
expected=$'<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
actual="$("$pico" template -m "$tmp/qwen3.gguf" --messages "$tmp/messages.json" --chat-template llama3; printf x)"
[[ "${actual%x}" == "$expected" ]] || fail "llama3 rendering differs: [${actual%x}]"

# Bad input: a clear error and exit status 1.
printf '%s' '[{"role":"user"}]' >"$tmp/bad.json"
for args in "--messages $tmp/bad.json" "--messages $tmp/messages.json --chat-template nope"; do
  set +e
  message="$("$pico" template -m "$tmp/qwen3.gguf" $args 2>&1 >/dev/null)"
  status=$?
  set -e
  [[ $status -eq 1 && "$message" == "pico template: "* ]] || fail "expected a clear error for '$args', got $status: $message"
done
echo "pico template: qwen3 from metadata, llama3 by name, bad input refused"
