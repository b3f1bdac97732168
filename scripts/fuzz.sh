#!/usr/bin/env bash
# Runs every fuzz target for a while, one after another (libFuzzer via cargo-fuzz):
#
#   ./scripts/fuzz.sh [seconds-per-target]      # default 60
#
# Fails if any target finds a crash or a broken property. Each target's working corpus lives in
# fuzz/corpus/<target> (not committed), seeded from fuzz/seeds/<target> (committed). The
# machine has a stable toolchain only; RUSTC_BOOTSTRAP=1 lets cargo-fuzz use the nightly flags
# it needs (sanitizers). See docs/fuzzing.md for longer campaigns.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked >&2
fi
cargo fuzz build -O >&2
failed=0
for target in $(cargo fuzz list); do
  mkdir -p "corpus/$target"
  cp -n seeds/"$target"/* "corpus/$target/" 2>/dev/null || true
  log="$(mktemp)"
  if cargo fuzz run -O "$target" "corpus/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 >"$log" 2>&1; then
    summary="$(grep -E '^#[0-9]+' "$log" | tail -n 1 | cut -c1-110)"
    echo "fuzz $target: ok  $summary"
  else
    failed=1
    echo "fuzz $target: FAILED (artifacts in fuzz/artifacts/$target)"
    grep -E 'panicked|ERROR|SUMMARY' -A8 "$log" | head -40
  fi
  rm -f "$log"
done
exit "$failed"
