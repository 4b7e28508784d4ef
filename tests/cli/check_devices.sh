#!/usr/bin/env bash
# pico inspect --devices: with no Vulkan driver it says why and that stages run on the
# CPU (exit 0); with one (lavapipe, which scripts/setup.sh installs) it lists the
# device, its memory and the limits the shaders query. Skipped (77) in a build
# without Vulkan, after checking that the listing says so.
#   check_devices.sh PICO
set -euo pipefail
pico="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

out="$(VK_ICD_FILENAMES=/nonexistent.json "$pico" inspect --devices)" || fail "exit status $? without a driver"
grep -q '^no compute device: stages run on the CPU$' <<<"$out" || fail "no-device listing: $out"

out="$("$pico" inspect --devices)" || fail "exit status $?"
echo "$out"
if grep -q '^vulkan: not in this build' <<<"$out"; then
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

set +e
err="$("$pico" inspect 2>&1)"
status=$?
set -e
[[ $status -eq 1 ]] || fail "inspect without a model or --devices: exit $status"
grep -q 'give a model (-m FILE) or --devices' <<<"$err" || fail "unclear error: $err"
echo "OK"
