#!/usr/bin/env bash
# Lint the tracked files (scripts/test.sh's first step; docs/testing.md):
#   - every C/C++ file against .clang-format (clang-format --dry-run -Werror);
#   - every shell script with shellcheck: *.sh, and files without the suffix
#     whose first line is a sh/bash shebang (tests/rxe/rxe-run, ...), so new
#     scripts are picked up without being listed here;
#   - the layers (docs/architecture.md): which headers each folder of src/
#     may include, and that the core's code (transport.c apart) names no
#     transport;
#   - commit subjects after the rule took effect: "area: subject", <= 72;
#   - every relative link in a tracked Markdown file names a file inside the
#     repository that exists (docs are read on clones without ../shared).
# Needs git, clang-format and shellcheck (scripts/deps.sh); no network.
# Fix a clang-format finding with `clang-format -i FILE`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v git >/dev/null || { echo "lint: git not found" >&2; exit 1; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
  { echo "lint: not a git checkout (the file lists come from git ls-files)" >&2; exit 1; }
for t in clang-format shellcheck; do
  command -v "$t" >/dev/null || { echo "lint: $t not found (scripts/deps.sh installs it)" >&2; exit 1; }
done
fail=0

# Tracked files that exist in the work tree (one being deleted is not linted).
c_files=()
scripts=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  case "$f" in
    *.c|*.h|*.cpp) c_files+=("$f") ;;
    *.sh) scripts+=("$f") ;;
    *)
      first=""
      IFS= read -r first <"$f" 2>/dev/null || true
      case "$first" in
        '#!'*/sh|'#!'*/sh' '*|'#!'*/bash|'#!'*/bash' '*|'#!'*'env bash'|'#!'*'env bash '*|'#!'*'env sh'|'#!'*'env sh '*)
          scripts+=("$f") ;;
      esac ;;
  esac
done < <(git ls-files -z)

if [ ${#c_files[@]} -gt 0 ] && ! clang-format --dry-run -Werror "${c_files[@]}"; then
  echo "lint: clang-format: the files above differ from .clang-format (fix: clang-format -i FILE)" >&2
  fail=1
fi
if [ ${#scripts[@]} -gt 0 ] && ! shellcheck "${scripts[@]}"; then
  echo "lint: shellcheck findings above" >&2
  fail=1
fi
# Layers: src/device sees base.h alone; transports see provider.h (and the
# pure config.h), never core.h, the device backends or another transport;
# the core sees no transport's headers and not the device backends.
layer() { # folder, allowed-pattern (ERE over the quoted path), what
  local f inc
  for f in src/"$1"/*.c src/"$1"/*.h; do
    [ -f "$f" ] || continue
    while IFS= read -r inc; do
      if ! printf '%s\n' "$inc" | grep -qE "$2"; then
        echo "lint: $f includes \"$inc\": $3 (docs/architecture.md, Layers)" >&2
        fail=1
      fi
    done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
  done
}
layer device '^(\.\./core/base\.h|device\.h|backend\.h)$' 'src/device may include ../core/base.h and its own headers only'
for tp in self shm verbs fabric; do
  layer "$tp" "^(\.\./core/(provider|config)\.h|${tp}_[a-z_]+\.h)$" \
    "a transport may include ../core/provider.h, ../core/config.h and its own headers only"
done
layer core '^([a-z_]+\.h|\.\./device/device\.h)$' 'the core may include its own headers and ../device/device.h only'

# The core names no transport (docs/architecture.md, "What a transport
# owns"): outside transport.c, the registry, no shm, verbs or fabric in its
# code once comments are stripped (the compiler's own comment removal).
if command -v gcc >/dev/null; then
  for f in src/core/*.c src/core/*.h; do
    [ "$f" = src/core/transport.c ] && continue
    if gcc -fpreprocessed -dD -E -P "$f" 2>/dev/null | grep -q -i -E 'shm|verbs|fabric'; then
      echo "lint: $f names a transport in its code; a transport's part belongs in its ops table" >&2
      fail=1
    fi
  done
fi

# Commit subjects since the rule took effect: "area: subject", at most 72
# characters (older history predates it; a shallow clone without the base
# checks nothing).
subject_base=34b8fe8
if git cat-file -e "$subject_base^{commit}" 2>/dev/null; then
  while IFS= read -r subj; do
    if [ "${#subj}" -gt 72 ] || ! printf '%s\n' "$subj" | grep -qE '^[A-Za-z0-9_./+-]+(, [A-Za-z0-9_./+-]+)*: [^ ]'; then
      echo "lint: commit subject \"$subj\": want \"area: subject\", at most 72 characters" >&2
      fail=1
    fi
  done < <(git log --no-merges --format=%s "$subject_base..HEAD")
fi

# Relative Markdown links: [text](path) or [text](path#anchor).
root=$(pwd -P)
nlinks=0
while IFS= read -r -d '' md; do
  [ -f "$md" ] || continue
  dir=$(dirname "$md")
  while IFS= read -r target; do
    target=${target%%#*}
    [ -n "$target" ] || continue
    nlinks=$((nlinks + 1))
    full=$(realpath -m "$dir/$target")
    case "$full" in
      "$root"/*) [ -e "$full" ] || { echo "lint: $md links to $target, which does not exist" >&2; fail=1; } ;;
      *) echo "lint: $md links to $target, outside the repository" >&2; fail=1 ;;
    esac
  done < <(grep -o '\]([^)]*)' "$md" | sed 's/^](//; s/)$//' | grep -v -E '^(https?:|mailto:|#)' || true)
done < <(git ls-files -z '*.md')

[ "$fail" -eq 0 ] && echo "lint: ${#c_files[@]} C/C++ files, ${#scripts[@]} shell scripts, $nlinks Markdown links clean"
exit "$fail"
