#!/usr/bin/env bash
# Builds the bench/ program NAME (a `[[bench]]` target: the bench profile,
# i.e. the release settings) and prints the path of its executable, for
# drivers that run it more than once or outside cargo.
# Usage: bench/exe.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --no-run --bench "$1" --message-format=json-render-diagnostics | python3 -c '
import json, sys
name = sys.argv[1]
for m in map(json.loads, sys.stdin):
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable"):
        print(m["executable"])
' "$1"
