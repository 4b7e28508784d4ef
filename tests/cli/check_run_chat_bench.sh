#!/usr/bin/env bash
# pico run, chat and bench as a user runs them:
# - run --temp 0 prints only the generated text on stdout, the same twice; a seeded
#   sampled run is the same twice too;
# - chat's second reply (computed reusing the first turn's KV) equals `pico run` on
#   the whole rendered conversation (computed from scratch);
# - bench --json prints one line with positive prefill and decode rates.
#   check_run_chat_bench.sh PICO
set -euo pipefail
pico="$1"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/pico_run.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$pico" mkmodel --arch qwen3 --vocab qwen3 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 -o "$tmp/m.gguf" 2>/dev/null

first="$("$pico" run -m "$tmp/m.gguf" -p "The weather today" -n 16 --temp 0 -t 1 2>"$tmp/log")"
second="$("$pico" run -m "$tmp/m.gguf" -p "The weather today" -n 16 --temp 0 -t 1 2>/dev/null)"
[[ -n "$first" ]] || fail "pico run printed nothing"
[[ "$first" == "$second" ]] || fail "greedy runs differ"
grep -q "generated" "$tmp/log" || fail "pico run printed no timings on stderr"
[[ "$first" != *"generated"* ]] || fail "timings leaked into stdout"
# A prompt longer than a batch shows its progress (log lines off a terminal), and the
# batch size changes no token.
long="$(printf 'word%d ' $(seq 1 60))"
plain="$("$pico" run -m "$tmp/m.gguf" -p "$long" -n 8 --temp 0 -t 1 2>/dev/null)"
batched="$("$pico" run -m "$tmp/m.gguf" -p "$long" -n 8 --temp 0 -t 1 -b 16 2>"$tmp/progress.log")"
[[ "$plain" == "$batched" ]] || fail "-b 16 changed the reply"
grep -Eq "prompt: 0% \(0 of [0-9]+ tokens\)" "$tmp/progress.log" &&
  grep -Eq "prompt: 100% \(([0-9]+) of \1 tokens\)" "$tmp/progress.log" || fail "no prompt progress: $(cat "$tmp/progress.log")"
[[ "$batched" != *"prompt: "* ]] || fail "progress leaked into stdout"
# Low memory: --prefault reads the weights with its progress, --mem locks within a budget
# and streams the rest; neither changes a token.
low="$("$pico" run -m "$tmp/m.gguf" -p "The weather today" -n 16 --temp 0 -t 1 --prefault --mem 1M 2>"$tmp/low.log")"
[[ "$low" == "$first" ]] || fail "--prefault --mem changed the reply"
grep -q "prefault: 100%" "$tmp/low.log" && grep -q "the rest streamed layer by layer" "$tmp/low.log" ||
  fail "no prefault progress or streaming: $(cat "$tmp/low.log")"
a="$("$pico" run -m "$tmp/m.gguf" -p "Hi" -n 16 --temp 0.9 --seed 42 -t 1 2>/dev/null)"
b="$("$pico" run -m "$tmp/m.gguf" -p "Hi" -n 16 --temp 0.9 --seed 42 -t 1 2>/dev/null)"
[[ "$a" == "$b" ]] || fail "seeded runs differ"

printf 'Hello there\nTell me more\n' | "$pico" chat -m "$tmp/m.gguf" -n 12 --temp 0 -t 1 >"$tmp/chat.txt" 2>/dev/null
mapfile -t replies <"$tmp/chat.txt"
[[ ${#replies[@]} -ge 2 ]] || fail "chat gave ${#replies[@]} replies for 2 turns"
python3 - "$tmp/conversation.json" "${replies[0]}" <<'PY'
import json, sys
json.dump([{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": sys.argv[2]},
           {"role": "user", "content": "Tell me more"}], open(sys.argv[1], "w"))
PY
prompt="$("$pico" template -m "$tmp/m.gguf" --messages "$tmp/conversation.json"; printf x)"
expected="$("$pico" run -m "$tmp/m.gguf" -p "${prompt%x}" -n 12 --temp 0 -t 1 2>/dev/null)"
[[ "${replies[1]}" == "$expected" ]] || fail "chat's second reply [${replies[1]}] differs from run on the conversation [$expected]"

json="$("$pico" bench -m "$tmp/m.gguf" -p 32 -n 8 -t 1 --repeat 1 --json)"
python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert d['prefill_tps'] > 0 and d['decode_tps'] > 0, d" "$json" ||
  fail "bad bench output: $json"
echo "pico run/chat/bench: deterministic, prefix-reusing chat equals run, bench $json"
