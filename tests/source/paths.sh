#!/usr/bin/env bash
# Every repository path the docs, the README and the code's comments name exists: a file moved or
# renamed must take its mentions along. Paths with a pattern in them (`*`, `<op>`) are skipped.
#   paths.sh SOURCE_DIR
set -u
cd "$1"
status=0
# Comment text of the code (// and # lines), and the whole of the docs and the README.
texts() {
  cat README.md docs/*.md
  git ls-files 2>/dev/null | grep -E '\.(cpp|hpp|cu|def|h)$' | xargs grep -h '//' 2>/dev/null | sed 's|.*//||'
  git ls-files 2>/dev/null | grep -E '(\.sh|\.py|CMakeLists\.txt|\.toml)$' | xargs grep -h '#' 2>/dev/null | sed 's|^[^#]*#||'
}
# A path starts the text or follows a character that cannot be part of one (not inside a URL).
missing=$(texts | grep -oE '(^|[^A-Za-z0-9_./-])(src|kernels|reference|verify|tests|scripts|datasets|docs)/[A-Za-z0-9_./*<>{}-]*' \
  | sed -E 's/^[^a-z]//; s/[.,;:)]+$//' | grep -vE '[*<>{}]' | sort -u | while read -r p; do [ -e "$p" ] || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "paths: named but not in the tree:" >&2
  echo "$missing" | sed 's/^/  /' >&2
  status=1
fi
[ "$status" -eq 0 ] && echo "paths: every path the docs, the README and the comments name exists"
exit "$status"
