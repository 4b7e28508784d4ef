#!/usr/bin/env bash
# pico inspect --devices: with no Vulkan driver it says why and that stages run on the
# CPU (exit 0); with one (lavapipe, which scripts/setup.sh installs) it lists the
# device, its memory and the limits the shaders query. Then `--backend vulkan`: pico
# eval's logits through the device equal the CPU's to float rounding (an F32 model),
# and a device that is not there is a clear error. Skipped (77) in a build without
# Vulkan, after checking that the listing and --backend say so. pico-worker refuses a
# range whose weights, or weights and the KV cache of one sequence, exceed the device's
# memory (--device-memory), naming the sizes.
#   check_devices.sh PICO PICO_WORKER
set -euo pipefail
pico="$1" worker="$2"
fail() { echo "FAIL: $*" >&2; exit 1; }

out="$(VK_ICD_FILENAMES=/nonexistent.json "$pico" inspect --devices)" || fail "exit status $? without a driver"
grep -q '^no compute device: stages run on the CPU$' <<<"$out" || fail "no-device listing: $out"

out="$("$pico" inspect --devices)" || fail "exit status $?"
echo "$out"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/pico_devices.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$pico" mkmodel --arch llama --vocab llama2 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 -o "$tmp/m.gguf" 2>/dev/null
tokens="$tmp/tokens.json"
echo '[1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278]' >"$tokens"
expect_error() {  # expect_error PATTERN ARGS...: exit status 1 and PATTERN in the message
  local pattern="$1" status
  shift
  set +e
  err="$("$@" 2>&1)"
  status=$?
  set -e
  [[ $status -eq 1 ]] || fail "$* : exit $status, expected 1"
  grep -q "$pattern" <<<"$err" || fail "$* : unclear error: $err"
}

if grep -q '^vulkan: not in this build' <<<"$out"; then
  expect_error 'vulkan: not in this build' "$pico" eval -m "$tmp/m.gguf" --tokens "$tokens" --backend vulkan
  echo "SKIPPED: this build has no Vulkan backend (PICO_VULKAN=OFF)"
  exit 77
fi
if grep -q '^vulkan: no device' <<<"$out"; then
  echo "SKIPPED: no Vulkan driver on this machine (scripts/setup.sh installs mesa-vulkan-drivers)"
  exit 77
fi
grep -Eq '^vulkan 0: .+ \((discrete|integrated|virtual|cpu|other)\), .+, [0-9.]+ [KMGT]iB memory, (usable|not usable: .+)$' \
  <<<"$out" || fail "device line malformed"
grep -Eq '^    subgroup [0-9]+, shared memory [0-9]+ KiB, binding range [0-9]+ MiB, offset alignment [0-9]+$' <<<"$out" ||
  fail "limits line malformed"

expect_error 'give a model (-m FILE) or --devices' "$pico" inspect

"$pico" eval -m "$tmp/m.gguf" --tokens "$tokens" --logits "$tmp/cpu.bin" >/dev/null
"$pico" eval -m "$tmp/m.gguf" --tokens "$tokens" --logits "$tmp/vulkan.bin" --backend vulkan >/dev/null
python3 - "$tmp/cpu.bin" "$tmp/vulkan.bin" <<'PY' || fail "Vulkan logits differ from the CPU's"
import array, sys
a, b = (array.array("f", open(p, "rb").read()) for p in sys.argv[1:])
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
scale = max(abs(x) for x in a)
worst = max(abs(x - y) for x, y in zip(a, b)) / scale
print(f"--backend vulkan: {len(a)} logits, largest difference {worst:.2e} of the largest |logit|")
assert worst < 1e-4, worst
PY
expect_error 'vulkan: no device 9' "$pico" eval -m "$tmp/m.gguf" --tokens "$tokens" --backend vulkan --device 9
VK_ICD_FILENAMES=/nonexistent.json expect_error 'vulkan: no device 0' "$pico" eval -m "$tmp/m.gguf" --tokens "$tokens" --backend vulkan
expect_error 'is a CPU backend mode' "$pico" eval -m "$tmp/m.gguf" --tokens "$tokens" --backend vulkan --llama-numerics

# Device memory: the 2-layer model's weights (mostly its 32k-token embeddings) are ~16 MiB.
weights=$(python3 -c "import os; print(os.path.getsize('$tmp/m.gguf'))")
expect_error "layers 0-1: their weights take [0-9]* bytes (.*) but vulkan device 0 (.*) offers 65536 bytes (0 MiB, --device-memory): give this stage fewer layers" \
  "$worker" -m "$tmp/m.gguf" --listen "ipc://$tmp/w.sock" --backend vulkan --device-memory 64K
# The KV cache is device memory too: room for the weights but not for one sequence of
# the model's context is refused, naming the KV bytes.
expect_error "layers 0-1: their weights take [0-9]* bytes (.*) and the KV cache of one sequence of [0-9]* positions [0-9]* bytes (.*) but vulkan device 0 (.*) offers [0-9]* bytes (.*, --device-memory): lower --ctx or give this stage fewer layers" \
  "$worker" -m "$tmp/m.gguf" --listen "ipc://$tmp/w.sock" --backend vulkan --device-memory "$((weights + 65536))" --ctx 4096
expect_error "device backend's memory; the cpu backend has none" \
  "$worker" -m "$tmp/m.gguf" --listen "ipc://$tmp/w.sock" --device-memory 64K
set +e
timeout 20 "$worker" -m "$tmp/m.gguf" --listen "ipc://$tmp/w.sock" --backend vulkan --device-memory "$((weights * 2))" \
  2>"$tmp/worker.log" &
worker_pid=$!
for _ in $(seq 200); do grep -q "listening on" "$tmp/worker.log" && break; sleep 0.1; done
kill "$worker_pid" 2>/dev/null
wait "$worker_pid"
set -e
grep -q "vulkan device 0: the layers' weights take .* of its .*; the KV cache's budget of .* is device memory" "$tmp/worker.log" &&
  grep -q "listening on" "$tmp/worker.log" || fail "a range within --device-memory does not load: $(cat "$tmp/worker.log")"
echo "OK"
