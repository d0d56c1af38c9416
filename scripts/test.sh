#!/usr/bin/env bash
# The project's test command: installs missing test tools, builds every target
# and runs every test. Tests start their own redis-server/nginx/namespaces;
# nothing here starts a system service.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-deps.sh
cargo build --all-targets
# Each criterion benchmark once, as a smoke test. Criterion rejects libtest's
# --test-threads, hence the separate run and RUST_TEST_THREADS below.
if compgen -G 'benches/*.rs' >/dev/null; then
  cargo test --bench '*'
fi
RUST_TEST_THREADS=2 cargo test --lib --bins --tests --examples
