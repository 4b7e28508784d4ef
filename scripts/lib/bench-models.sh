# Synthetic benchmark models shared by the bench scripts (sourced, not run). Each is
# made once and kept.

# tinyllama_shaped PICO DIR TYPE [THREADS]: the path of a TinyLlama-1.1B-shaped
# synthetic model (22 layers, embd 2048, ff 5632, 32 heads / 4 KV heads, 32k vocab,
# llama2 vocabulary) of TYPE (f16, or what `pico quantize` takes) in DIR, made from
# the F16 one (2.2 GB) when missing.
tinyllama_shaped() {
  local pico=$1 dir=$2 type=$3 threads=${4:-2}
  mkdir -p "$dir"
  local base="$dir/tinyllama-shaped-f16.gguf"
  if [ ! -f "$base" ]; then
    echo "making $base (2.2 GB)..." >&2
    "$pico" mkmodel --arch llama --vocab llama2 --layers 22 --embd 2048 --ff 5632 --heads 32 --kv-heads 4 \
      --ctx 2048 --type f16 --seed 1 -o "$base" >&2
  fi
  local model="$dir/tinyllama-shaped-$type.gguf"
  [ "$type" = f16 ] && model=$base
  [ -f "$model" ] || "$pico" quantize "$base" "$model" "$type" -t "$threads" >&2
  echo "$model"
}

# hybrid_shaped PICO DIR SHAPE TYPE [THREADS]: SHAPE qwen35-0.8b (a Qwen3.5-0.8B-like
# hybrid: 24 layers, embd 1024, ff 3584, gated attention every 4th layer with 8 / 2
# heads of 256 and rope over 64 dims, Gated DeltaNet layers with conv 4, state 128, 16
# key and 16 value heads, tied head, qwen3 vocabulary), qwen35moe-a3b (a Qwen3.5-35B-A3B-
# like MoE scaled to fit: 12 layers, embd 1024, 64 experts of ff 512, 8 used, a shared
# expert of 512, the same mixers) or qwen3moe-a3b (a Qwen3-30B-A3B-like MoE scaled the
# same way: 12 layers of plain qwen3 attention, 16 / 2 heads of 128, 64 experts of ff
# 512, 8 used, no shared expert), made from its F16 file when missing.
hybrid_shaped() {
  local pico=$1 dir=$2 shape=$3 type=$4 threads=${5:-2}
  mkdir -p "$dir"
  local base="$dir/$shape-f16.gguf" args
  local mixers="--heads 8 --kv-heads 2 --head-dim 256 --rope-dims 64 --full-attention-interval 4 --ssm-conv 4 --ssm-state 128 --ssm-groups 16 --ssm-value-heads 16"
  case "$shape" in
    qwen35-0.8b) args="--arch qwen35 --layers 24 --ff 3584 $mixers" ;;
    qwen35moe-a3b) args="--arch qwen35moe --layers 12 --ff 512 --experts 64 --experts-used 8 --expert-ff 512 --shared-expert-ff 512 $mixers" ;;
    qwen3moe-a3b) args="--arch qwen3moe --layers 12 --ff 512 --experts 64 --experts-used 8 --expert-ff 512 --heads 16 --kv-heads 2 --head-dim 128" ;;
    *) echo "hybrid_shaped: unknown shape $shape" >&2; return 2 ;;
  esac
  if [ ! -f "$base" ]; then
    echo "making $base..." >&2
    # shellcheck disable=SC2086
    "$pico" mkmodel $args --vocab qwen3 --embd 1024 --ctx 4096 --tied --type f16 --seed 1 -o "$base" >&2
  fi
  local model="$dir/$shape-$type.gguf"
  [ "$type" = f16 ] && model=$base
  [ -f "$model" ] || "$pico" quantize "$base" "$model" "$type" -t "$threads" >&2
  echo "$model"
}
