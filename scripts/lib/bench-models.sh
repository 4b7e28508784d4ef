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
