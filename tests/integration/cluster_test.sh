#!/usr/bin/env bash
# Integration tests of the pipeline: real pico-worker and pico-coord processes on
# loopback (ipc:// sockets in a temp dir, tcp:// on ports derived from the pid).
#
#   cluster_test.sh BUILD_DIR MODEL_DIR CASE
#
# CASE: models | equivalence-llama | equivalence-qwen3 | equivalence-qwen35 | equivalence-qwen3next | concurrency | mixed-vulkan | kill | hang | refuse | slow-link | kv-budget
set -euo pipefail
build=$1 models=$2 case=$3
pico=$build/tools/pico/pico worker=$build/worker/pico-worker coord=$build/coordinator/pico-coord
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pico-cluster-test.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -5 "$f" >&2; }; done; exit 1; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

# start_workers MODEL RANGES (comma-separated) [tcp]: sets $workers (--worker args);
# the first worker also gets the flags in $first_worker_flags.
first_worker_flags=()
start_workers() {
  local model=$1 ranges=$2 transport=${3:-ipc} k=0 address
  workers=()
  IFS=, read -ra list <<<"$ranges"
  for range in "${list[@]}"; do
    if [ "$transport" = tcp ]; then
      address="tcp://127.0.0.1:$((20000 + ($$ % 4000) * 8 + k))"
    else
      address="ipc://$tmp/w$k-$RANDOM.sock"
    fi
    local extra=()
    [ "$k" -eq 0 ] && extra=("${first_worker_flags[@]}")
    "$worker" -m "$model" --layers "$range" --listen "$address" -t 1 "${extra[@]}" 2>"$tmp/worker-$k.log" &
    pids+=($!)
    workers+=(--worker "$address")
    k=$((k + 1))
  done
}
# wait_listening LOG: until the worker of LOG listens (a worker measures its profile
# first, which on a device takes seconds: the coordinator's hello must not time out).
wait_listening() {
  for _ in $(seq 600); do grep -q "listening on" "$1" && return 0; sleep 0.1; done
  fail "no 'listening on' in $1"
}
stop_workers() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}

prompt="The quick brown fox jumps over the lazy dog, and then the dog wakes up and chases the fox around the farm"

case $case in
  models)
    mkdir -p "$models"
    "$pico" mkmodel --arch llama --vocab llama2 --layers 4 --embd 64 --ff 128 --heads 4 --kv-heads 2 --ctx 4096 \
      --seed 3 -o "$models/llama.gguf" >/dev/null
    "$pico" mkmodel --arch qwen3 --vocab qwen3 --layers 4 --embd 64 --ff 128 --heads 4 --kv-heads 2 --head-dim 32 \
      --ctx 4096 --seed 4 -o "$models/qwen3.gguf" >/dev/null
    # Hybrids: layers 0-2 Gated DeltaNet, layer 3 gated attention (the splits below cut
    # inside the linear run and at the attention layer).
    "$pico" mkmodel --arch qwen35 --vocab qwen3 --layers 4 --embd 64 --ff 128 --heads 4 --kv-heads 2 --head-dim 32 \
      --ssm-state 64 --ssm-groups 2 --ssm-value-heads 4 --full-attention-interval 4 --ctx 4096 --seed 5 \
      -o "$models/qwen35.gguf" >/dev/null
    "$pico" mkmodel --arch qwen3next --vocab qwen3 --layers 4 --embd 64 --ff 128 --heads 4 --kv-heads 2 --head-dim 32 \
      --ssm-state 64 --ssm-groups 2 --ssm-value-heads 4 --full-attention-interval 4 --experts 4 --experts-used 2 \
      --expert-ff 32 --shared-expert-ff 32 --ctx 4096 --seed 6 -o "$models/qwen3next.gguf" >/dev/null
    ;;

  equivalence-llama|equivalence-qwen3|equivalence-qwen35|equivalence-qwen3next)
    model=$models/${case#equivalence-}.gguf
    # The single node: every layer in-process.
    "$coord" -m "$model" -p "$prompt" -n 24 --temp 0 --print-tokens --dump-logits "$tmp/base.bin" \
      >"$tmp/base.txt" 2>"$tmp/base.log" || fail "single node run"
    [ -s "$tmp/base.bin" ] || fail "no logits from the single node"
    # pico eval (the single-node CLI) agrees: same greedy tokens from the same ids.
    "$pico" tokenize -m "$model" -p "$prompt" --special --ids >"$tmp/ids.json"
    "$pico" eval -m "$model" --tokens "$tmp/ids.json" --logits "$tmp/eval.bin" --greedy 24 -t 1 >"$tmp/eval.txt" 2>"$tmp/eval.log" \
      || fail "pico eval"
    cmp -s "$tmp/base.txt" "$tmp/eval.txt" || fail "pico eval gives $(cat "$tmp/eval.txt"), pico-coord $(cat "$tmp/base.txt")"
    row=$(( $(stat -c %s "$tmp/base.bin") / 24 ))  # bytes of one logits row
    cmp -s <(tail -c "$row" "$tmp/eval.bin") <(head -c "$row" "$tmp/base.bin") \
      || fail "the prompt's last logits differ from pico eval's"
    "$coord" -m "$model" -p "$prompt" -n 24 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 7 --print-tokens \
      >"$tmp/warm-base.txt" 2>"$tmp/base.log" || fail "single node run, temperature 1.5"
    cmp -s "$tmp/base.txt" "$tmp/warm-base.txt" && fail "sampling at temperature 1.5 gives the greedy tokens"
    for split in 0-3 0-1,2-3 0-0,1-2,3-3; do
      start_workers "$model" "$split"
      # Small micro-batches: prefill chunks are pipelined through the stages.
      "$coord" -m "$model" "${workers[@]}" -p "$prompt" -n 24 --temp 0 --micro-batch 5 --print-tokens \
        --dump-logits "$tmp/split.bin" >"$tmp/split.txt" 2>"$tmp/coord.log" || fail "cluster $split"
      cmp -s "$tmp/base.bin" "$tmp/split.bin" || fail "logits of split $split differ from the single node"
      cmp -s "$tmp/base.txt" "$tmp/split.txt" || fail "tokens of split $split differ: $(cat "$tmp/split.txt")"
      # Without --dump-logits a greedy request asks the last stage for the arg max only:
      # the same tokens. Sampling at a temperature needs (and gets) the full rows: the
      # same tokens as the single node with the same seed.
      "$coord" -m "$model" "${workers[@]}" -p "$prompt" -n 24 --temp 0 --micro-batch 5 --print-tokens \
        >"$tmp/argmax.txt" 2>"$tmp/coord.log" || fail "cluster $split, arg max only"
      cmp -s "$tmp/base.txt" "$tmp/argmax.txt" || fail "arg max tokens of split $split differ: $(cat "$tmp/argmax.txt")"
      # That single greedy stream ran in chains the last stage started itself; without
      # chains (--chain-steps 0), the same tokens.
      grep -q "chained steps [1-9]" "$tmp/coord.log" || fail "split $split: no greedy chain"
      "$coord" -m "$model" "${workers[@]}" -p "$prompt" -n 24 --temp 0 --micro-batch 5 --print-tokens --chain-steps 0 \
        >"$tmp/unchained.txt" 2>"$tmp/coord.log" || fail "cluster $split, no chains"
      grep -q "chained steps 0" "$tmp/coord.log" || fail "split $split: chained with --chain-steps 0"
      cmp -s "$tmp/base.txt" "$tmp/unchained.txt" || fail "unchained tokens of split $split differ"
      "$coord" -m "$model" "${workers[@]}" -p "$prompt" -n 24 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 7 \
        --print-tokens >"$tmp/warm.txt" 2>"$tmp/coord.log" || fail "cluster $split, temperature 1.5"
      cmp -s "$tmp/warm-base.txt" "$tmp/warm.txt" \
        || fail "sampled tokens of split $split differ: $(cat "$tmp/warm.txt"), single node $(cat "$tmp/warm-base.txt")"
      stop_workers
      echo "split $split: bit-identical ($(cat "$tmp/base.txt")); arg max only (chained and not) and sampled at temperature 1.5 too"
    done
    # Half-precision activations between workers run (not bit-identical by design).
    start_workers "$model" 0-1,2-3
    "$coord" -m "$model" "${workers[@]}" -p "$prompt" -n 8 --temp 0 --activations f16 >/dev/null 2>"$tmp/coord.log" \
      || fail "f16 activations"
    stop_workers
    ;;

  mixed-vulkan)
    # Issue 17: stage 0 on the CPU, stage 1 on Vulkan device 0 (lavapipe here). Four
    # concurrent sequences against the single node (logits within float rounding, the
    # same greedy tokens); each sequence alone through the mixed cluster equals its
    # batch bit for bit (batch invariance with a device stage); the coordinator sees
    # the device in the worker's capabilities. Exit 77 (skipped) without a device.
    if ! "$pico" inspect --devices | grep -q '^vulkan 0: .*, usable$'; then
      "$pico" inspect --devices
      echo "SKIPPED: no usable Vulkan device 0"
      exit 77
    fi
    model=$models/llama.gguf
    printf '%s\n' "Hi" "$prompt" "Once upon a time there was a" "1 2 3 4 5 6 7 8 9 10 11 12" >"$tmp/prompts.txt"
    "$coord" -m "$model" --prompts "$tmp/prompts.txt" -n 16 --temp 0 --print-tokens --dump-logits "$tmp/local.bin" \
      >"$tmp/local.txt" 2>"$tmp/local.log" || fail "single node"
    cpu_address="ipc://$tmp/cpu-$RANDOM.sock" vulkan_address="ipc://$tmp/vulkan-$RANDOM.sock"
    "$worker" -m "$model" --layers 0-1 --listen "$cpu_address" -t 1 2>"$tmp/worker-0.log" &
    pids+=($!)
    "$worker" -m "$model" --layers 2-3 --listen "$vulkan_address" -t 1 --backend vulkan 2>"$tmp/worker-1.log" &
    pids+=($!)
    wait_listening "$tmp/worker-1.log"
    workers=(--worker "$cpu_address" --worker "$vulkan_address")
    "$coord" -m "$model" "${workers[@]}" --prompts "$tmp/prompts.txt" -n 16 --temp 0 --micro-batch 7 --print-tokens \
      --dump-logits "$tmp/mixed.bin" >"$tmp/mixed.txt" 2>"$tmp/coord.log" || fail "mixed cluster"
    grep -q "stage 1: .*(.*vulkan, .*, 1 threads)" "$tmp/coord.log" || fail "the coordinator does not report the device"
    grep -q "backend vulkan on " "$tmp/worker-1.log" || fail "the worker does not log its device"
    diff "$tmp/local.txt" "$tmp/mixed.txt" || fail "mixed cluster tokens differ from the single node"
    python3 - "$tmp/local.bin" "$tmp/mixed.bin" <<'PY' || fail "mixed cluster logits differ from the single node beyond rounding"
import array, sys
a, b = (array.array("f", open(p, "rb").read()) for p in sys.argv[1:])
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
worst = max(abs(x - y) for x, y in zip(a, b)) / max(abs(x) for x in a)
print(f"mixed cluster: {len(a)} logits, largest difference {worst:.2e} of the largest |logit|")
assert worst < 1e-4, worst
PY
    : >"$tmp/alone.bin"
    while IFS= read -r p; do
      "$coord" -m "$model" "${workers[@]}" -p "$p" -n 16 --temp 0 --dump-logits "$tmp/one.bin" >/dev/null \
        2>"$tmp/coord.log" || fail "alone: $p"
      cat "$tmp/one.bin" >>"$tmp/alone.bin"
    done <"$tmp/prompts.txt"
    cmp -s "$tmp/alone.bin" "$tmp/mixed.bin" || fail "a sequence alone differs from its batch on the mixed cluster"
    # /metrics names each stage's backend and device.
    "$coord" -m "$model" "${workers[@]}" --port 0 2>"$tmp/serve.log" &
    serve=$!
    python3 - "$tmp/serve.log" >"$tmp/metrics.txt" <<'PY' || { kill "$serve"; fail "no /metrics from the mixed cluster"; }
import re, sys, time, urllib.request
for _ in range(300):
    found = re.search(r"listening on http://[^:]+:(\d+)", open(sys.argv[1]).read())
    if found:
        break
    time.sleep(0.1)
print(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % found.group(1), timeout=30).read().decode())
PY
    kill "$serve"
    wait "$serve" 2>/dev/null || true
    grep -q '^pico:stage_info{stage="0",layers="0-1",backend="cpu",isa="[a-z0-9]*",device=""} 1$' "$tmp/metrics.txt" ||
      fail "/metrics does not say stage 0 runs on the CPU"
    grep -q '^pico:stage_info{stage="1",layers="2-3",backend="vulkan",isa="[a-z0-9]*",device=".\+"} 1$' "$tmp/metrics.txt" ||
      fail "/metrics does not name stage 1's Vulkan device"
    grep -q '^pico:stage_device_memory_bytes{stage="1"} [1-9]' "$tmp/metrics.txt" ||
      fail "/metrics does not give stage 1's device memory"
    ;;

  concurrency)
    model=$models/llama.gguf
    # Eight sequences of different prompt lengths (1 to ~60 tokens).
    printf '%s\n' "Hi" "$prompt" "Once upon a time there was a" "$prompt $prompt" "A" \
      "The quick brown fox jumps over the lazy dog, twice: the quick brown fox jumps over the lazy dog." \
      "1 2 3 4 5 6 7 8 9 10 11 12" "$prompt $prompt $prompt" >"$tmp/prompts.txt"
    : >"$tmp/alone.txt"
    : >"$tmp/alone.bin"
    start_workers "$model" 0-1,2-3
    while IFS= read -r p; do
      "$coord" -m "$model" "${workers[@]}" -p "$p" -n 20 --temp 0 --print-tokens --dump-logits "$tmp/one.bin" \
        >>"$tmp/alone.txt" 2>"$tmp/coord.log" || fail "alone: $p"
      cat "$tmp/one.bin" >>"$tmp/alone.bin"
    done <"$tmp/prompts.txt"
    "$coord" -m "$model" "${workers[@]}" --prompts "$tmp/prompts.txt" -n 20 --temp 0 --micro-batch 7 \
      --print-tokens --dump-logits "$tmp/together.bin" >"$tmp/together.txt" 2>"$tmp/coord.log" || fail "together"
    diff "$tmp/alone.txt" "$tmp/together.txt" || fail "concurrent sequences differ from alone"
    cmp -s "$tmp/alone.bin" "$tmp/together.bin" || fail "concurrent logits differ from alone"
    [ "$(wc -l <"$tmp/together.txt")" -eq 8 ] || fail "expected 8 completions"
    # Greedy without --dump-logits: the last stage sends each token's arg max only.
    "$coord" -m "$model" "${workers[@]}" --prompts "$tmp/prompts.txt" -n 20 --temp 0 --micro-batch 7 \
      --print-tokens >"$tmp/together-argmax.txt" 2>"$tmp/coord.log" || fail "together, arg max only"
    diff "$tmp/alone.txt" "$tmp/together-argmax.txt" || fail "concurrent arg max tokens differ from alone"
    # And the same as the single node.
    "$coord" -m "$model" --prompts "$tmp/prompts.txt" -n 20 --temp 0 --print-tokens >"$tmp/local.txt" \
      2>"$tmp/local.log" || fail "local"
    diff "$tmp/alone.txt" "$tmp/local.txt" || fail "cluster differs from the single node"
    echo "8 concurrent sequences: same tokens and logits as alone"
    ;;

  kill|hang)
    model=$models/llama.gguf
    start_workers "$model" 0-1,2-3 tcp
    # kill: the first stage (the coordinator is waiting on the last one); hang: the last.
    if [ "$case" = kill ]; then victim=${pids[0]}; else victim=${pids[1]}; fi
    "$coord" -m "$model" "${workers[@]}" -p "$prompt" -n 3000 -c 4000 --temp 0 >/dev/null 2>"$tmp/coord.log" &
    coord_pid=$!
    # Once both stages are planned, tokens are flowing: the request (seconds of decoding)
    # is in flight, whatever the time loading and connecting took.
    for ((i = 0; i < 400; ++i)); do
      grep -q "stage 1:" "$tmp/coord.log" && break
      kill -0 "$coord_pid" 2>/dev/null || break
      sleep 0.05
    done
    sleep 0.3
    kill -0 "$coord_pid" 2>/dev/null || fail "the request ended before the worker went away"
    t0=$(ms)
    disown "$victim"  # no "Killed" notice from the shell
    if [ "$case" = kill ]; then kill -9 "$victim"; else kill -STOP "$victim"; fi
    status=0
    wait "$coord_pid" || status=$?
    elapsed=$(( $(ms) - t0 ))
    [ "$case" = hang ] && kill -9 "$victim"
    [ "$status" -ne 0 ] || fail "pico-coord exited 0 after its worker went away"
    grep -q "worker tcp://127.0.0.1" "$tmp/coord.log" || fail "the error does not name the worker"
    [ "$elapsed" -lt 2000 ] || fail "failure detected after $elapsed ms (limit 2000)"
    echo "$case: detected in $elapsed ms: $(grep -m1 error "$tmp/coord.log")"
    ;;

  slow-link)
    # A stage that stalls again and again (SIGSTOP for less than the failure timeout)
    # while 8 sequences are in flight: no deadlock, everything completes, the same
    # tokens and logits as an undisturbed run.
    model=$models/llama.gguf
    printf '%s\n' "Hi" "$prompt" "Once upon a time there was a" "$prompt $prompt" "A" "1 2 3 4 5 6 7 8 9 10" \
      "The quick brown fox jumps over the lazy dog, twice" "$prompt $prompt $prompt" >"$tmp/prompts.txt"
    run=(--prompts "$tmp/prompts.txt" -n 160 --temp 0 --micro-batch 5 --print-tokens)
    start_workers "$model" 0-0,1-2,3-3
    "$coord" -m "$model" "${workers[@]}" "${run[@]}" --dump-logits "$tmp/calm.bin" >"$tmp/calm.txt" 2>"$tmp/coord.log" \
      || fail "undisturbed run"
    victim=${pids[1]}
    "$coord" -m "$model" "${workers[@]}" "${run[@]}" --dump-logits "$tmp/slow.bin" >"$tmp/slow.txt" \
      2>"$tmp/coord-slow.log" &
    coord_pid=$!
    pulses=0
    while kill -0 "$coord_pid" 2>/dev/null; do
      if grep -q "stage 2:" "$tmp/coord-slow.log"; then  # connected and planned: steps are flowing
        kill -STOP "$victim"
        sleep 0.4
        kill -CONT "$victim"
        pulses=$((pulses + 1))
        sleep 0.05
      else
        sleep 0.02
      fi
    done
    kill -CONT "$victim" 2>/dev/null || true
    wait "$coord_pid" || fail "the run with a stalling stage failed: $(grep -m1 error "$tmp/coord-slow.log")"
    [ "$pulses" -ge 2 ] || fail "the run ended before the stage stalled twice ($pulses)"
    diff "$tmp/calm.txt" "$tmp/slow.txt" || fail "tokens differ with a stalling stage"
    cmp -s "$tmp/calm.bin" "$tmp/slow.bin" || fail "logits differ with a stalling stage"
    echo "slow link: $pulses stalls of 400 ms, 8 sequences, the same tokens and logits"
    ;;

  refuse)
    llama=$models/llama.gguf qwen=$models/qwen3.gguf
    expect_refusal() {  # PATTERN DESCRIPTION
      local status=0
      "$coord" -m "$llama" "${workers[@]}" -p "$prompt" -n 4 --temp 0 >/dev/null 2>"$tmp/coord.log" || status=$?
      [ "$status" -ne 0 ] || fail "$2: accepted"
      grep -q "$1" "$tmp/coord.log" || fail "$2: unexpected message: $(cat "$tmp/coord.log")"
      echo "$2: $(grep -m1 error "$tmp/coord.log")"
      stop_workers
    }
    start_workers "$qwen" 0-1,2-3
    expect_refusal "serves another model" "wrong model"
    start_workers "$llama" 0-2,2-3
    expect_refusal "overlaps" "overlapping ranges"
    start_workers "$llama" 0-1,3-3
    expect_refusal "no stage holds layers 2-2" "a gap"
    start_workers "$llama" 0-1
    expect_refusal "no stage holds layers 2-3" "missing last layers"
    ;;

  kv-budget)
    # The first worker's KV budget holds 3 sequences of the model's 4096 positions
    # (layers 0-1: 2 x (K + V) x 2 heads x 16 dims x 2 bytes = 256 bytes a position, 1 MiB
    # a sequence): pico-coord cuts --parallel 8 to 3, naming the stage, and gives the
    # tokens of a run without limits (5 prompts: some wait for a sequence to end).
    llama=$models/llama.gguf
    args=(-m "$llama" -p "$prompt" -p "a b c" -p "Once upon a time" -p "1 2 3 4" -p "the end" -n 8 --temp 0
          --print-tokens)
    "$coord" "${args[@]}" >"$tmp/base.txt" 2>"$tmp/base.log" || fail "single node run"
    first_worker_flags=(--kv-memory 3M)
    start_workers "$llama" 0-1,2-3
    "$coord" "${workers[@]}" "${args[@]}" --parallel 8 >"$tmp/cut.txt" 2>"$tmp/coord.log" || fail "cut cluster run"
    grep -q "parallel 8 cut to 3: stage .* (layers 0-1) has a KV budget of 3145728 bytes, 1048576 per sequence of ctx 4096" \
      "$tmp/coord.log" || fail "no log line of the cut: $(cat "$tmp/coord.log")"
    grep -q "ctx 4096, 3 parallel sequences" "$tmp/coord.log" || fail "not sized to 3 sequences"
    cmp -s "$tmp/base.txt" "$tmp/cut.txt" || fail "tokens with 3 sequences at once differ from the single node's"
    echo "cut: $(grep -m1 "cut to" "$tmp/coord.log")"
    stop_workers
    # Not even one sequence of 4096 positions fits 512 KiB: refused with the numbers.
    first_worker_flags=(--kv-memory 512K)
    start_workers "$llama" 0-1,2-3
    status=0
    "$coord" "${workers[@]}" "${args[@]}" >/dev/null 2>"$tmp/coord.log" || status=$?
    [ "$status" -ne 0 ] || fail "started with a KV budget under one sequence"
    grep -q "one sequence of ctx 4096 takes 1048576 bytes of KV, more than its budget of 524288 bytes: use --ctx 2048 or less, or give that worker --kv-memory 1048576 or more" \
      "$tmp/coord.log" || fail "unexpected refusal: $(cat "$tmp/coord.log")"
    echo "refused: $(grep -m1 "one sequence" "$tmp/coord.log")"
    # As the message says: --ctx 2048 fits one sequence there.
    "$coord" "${workers[@]}" "${args[@]}" --ctx 2048 >"$tmp/small.txt" 2>"$tmp/coord.log" || fail "run with --ctx 2048"
    grep -q "ctx 2048, 1 parallel sequences" "$tmp/coord.log" || fail "not sized to 1 sequence of 2048"
    cmp -s "$tmp/base.txt" "$tmp/small.txt" || fail "tokens with one sequence at a time differ"
    ;;

  *) echo "unknown case $case" >&2; exit 2 ;;
esac
