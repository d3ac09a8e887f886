# lib.sh — what the CLI test scripts share: pass/fail counting and expect.
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAILED: $*"; }
# expect RC PATTERN -- CMD...: exit code RC and combined output matching PATTERN
expect() {
  local rc=$1 pat=$2; shift 3
  local out got
  out=$("$@" 2>&1); got=$?
  if [ "$got" -ne "$rc" ]; then bad "$* exited $got, wanted $rc: $out"; return; fi
  if ! grep -qE -- "$pat" <<<"$out"; then bad "$*: output lacks /$pat/: $out"; return; fi
  ok
}
