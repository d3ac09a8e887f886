#!/usr/bin/env bash
# run_filecheck.sh FILE TFUSE FILECHECK — run every `# RUN:` line of FILE, with
# %s = FILE, %tfuse = the tfuse binary, %examples = examples/, FileCheck = LLVM's FileCheck, %t = a
# fresh temporary path. Each RUN line is a pipeline run by bash with pipefail.
set -u
file=$1 tfuse=$2 filecheck=$3
# LLVM's `not` lives beside FileCheck
export PATH="$(dirname "$(readlink -f "$(command -v "$filecheck")")"):$PATH"
examples=$(cd "$(dirname "$0")/../examples" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
while IFS= read -r line; do
  cmd=${line#*RUN:}
  cmd=${cmd//%tfuse/$tfuse}
  cmd=${cmd//%examples/$examples}
  cmd=${cmd//%s/$file}
  cmd=${cmd//%t/$tmp/t$n}
  cmd=${cmd//FileCheck/$filecheck}
  n=$((n + 1))
  if ! bash -o pipefail -c "$cmd"; then
    echo "FAILED: RUN line $n of $file:"
    echo "  $cmd"
    exit 1
  fi
done < <(grep -E '^#[[:space:]]*RUN:' "$file")
if [ "$n" -eq 0 ]; then echo "no RUN lines in $file"; exit 1; fi
echo "$n RUN lines passed"
