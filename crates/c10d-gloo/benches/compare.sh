#!/usr/bin/env bash
# Runs c10d-gloo and PyTorch's Gloo back to back with the same sizes and iteration counts, and
# prints both tables plus the ratios (ours / PyTorch: busbw ratio, and time ratio PyTorch/ours).
# usage: crates/c10d-gloo/benches/compare.sh [NPROC] [OP] [MAX_BYTES]
set -euo pipefail
N=${1:-2}; OP=${2:-all_reduce}; MAX=${3:-67108864}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${C10D_TORCH_PYTHON:-$HOME/.cache/c10d-rs/torch-venv/bin/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build -q --release -p c10d-gloo --bin c10d-gloo-worker --manifest-path "$ROOT/Cargo.toml"
OURS=$(mktemp); THEIRS=$(mktemp)
"$CARGO_TARGET_DIR/release/c10d-gloo-worker" launch --nproc "$N" --op "$OP" --max-bytes "$MAX" | tee "$OURS"
"$PY" "$ROOT/crates/c10d-gloo/benches/torch_gloo_bench.py" --nproc "$N" --op "$OP" --max-bytes "$MAX" | tee "$THEIRS"
echo "# ratios ($N ranks, $OP): speed-up = torch time / c10d-gloo time"
paste <(grep " float " "$OURS") <(grep " float " "$THEIRS") | awk '{printf "%12s  ours %10.1f us  torch %10.1f us  speed-up %6.2fx  busbw %7.3f vs %7.3f GB/s\n", $1, $4, $11, $11/$4, $6, $13}'
rm -f "$OURS" "$THEIRS"
