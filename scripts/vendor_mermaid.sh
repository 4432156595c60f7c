#!/usr/bin/env bash
# Refresh the vendored Mermaid bundle from the npm registry (the site never loads it from a CDN).
# Usage: bash scripts/vendor_mermaid.sh [version-range]   (default: 11)
set -euo pipefail
version="${1:-11}"
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
npm pack "mermaid@${version}" >/dev/null
tar xzf mermaid-*.tgz package/dist/mermaid.min.js package/LICENSE package/package.json
dest="$root/docs/assets/javascripts"
cp package/dist/mermaid.min.js "$dest/mermaid.min.js"
cp package/LICENSE "$dest/mermaid.LICENSE.txt"
echo "vendored mermaid $(python3 -c 'import json;print(json.load(open("package/package.json"))["version"])') into $dest"
