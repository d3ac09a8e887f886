#!/usr/bin/env bash
# run_bad.sh TFUSE BAD_DIR GEN_DIR — malformed model files must be rejected
# cleanly: exit status exactly 1 (not a crash, not a sanitizer's 86/87),
# nothing on stdout, and one diagnostic on stderr that names the file.
#
# 1. Every BAD_DIR/*.ir starts with a line
#        # EXPECT: LINE:COL: SUBSTRING
#    and `TFUSE print FILE` must write to stderr a message that starts with
#    "FILE:LINE:COL: error: " and contains SUBSTRING. A second line
#        # ARGS: COMMAND [FLAGS...]
#    runs `TFUSE COMMAND FILE FLAGS...` instead (errors that compiling finds,
#    such as `compile FILE --mode=train`).
# 2. Inputs that are awkward to commit are generated into GEN_DIR: binary
#    garbage, a file over the 64 MiB source limit, 100000 '[' or '(' on one
#    line, a 10000-character identifier, a 1200-character path, a directory,
#    a missing file. Each must be rejected with exit 1 and a message that
#    starts with the path.
# 3. An empty file is rejected ("the model is empty", at 1:1), and a chain
#    of 20000 relu ops must parse, print and re-parse to the same text (a guard against
#    quadratic behaviour; its time is printed).
#
# The last line is "N passed, M failed"; the exit status is 1 if any failed.
set -u
export LC_ALL=C

if [ $# -ne 3 ]; then
    echo "usage: $0 TFUSE BAD_DIR GEN_DIR" >&2
    exit 2
fi
TFUSE=$1
BAD_DIR=$2
GEN_DIR=$3
TIMEOUT=${TFUSE_BAD_TIMEOUT:-120}   # seconds per run: a hang is a failure

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
    failed=$((failed + 1))
    echo "FAIL: $*"
}
# A path for a failure line: very long ones elided in the middle.
short() { if [ ${#1} -gt 160 ]; then echo "${1:0:60}...${1: -80}"; else echo "$1"; fi; }

mkdir -p "$GEN_DIR" || exit 1
OUT=$GEN_DIR/.stdout
ERR=$GEN_DIR/.stderr

# run FILE [COMMAND FLAGS...]: TFUSE COMMAND FILE FLAGS... (default: print)
# with stdout/stderr captured; sets $rc and $msg (the first line of stderr).
run() {
    local f=$1 cmd=${2:-print}
    shift
    shift || true
    timeout "$TIMEOUT" "$TFUSE" "$cmd" "$f" "$@" >"$OUT" 2>"$ERR"
    rc=$?
    msg=$(head -n 1 "$ERR" | tr -d '\000')
}

# describe: what went wrong, for a failure line.
describe() {
    local what="exit $rc"
    case $rc in
        124) what="timed out after ${TIMEOUT}s" ;;
        86) what="AddressSanitizer report (exit 86)" ;;
        87) what="UndefinedBehaviorSanitizer report (exit 87)" ;;
        2) what="usage error (exit 2)" ;;
    esac
    if [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then what="killed by signal $((rc - 128))"; fi
    echo "$what; stderr: $(head -c 2000 "$ERR" | tr -d '\000')"
}

# expect_reject FILE PREFIX_RE [SUBSTRING]: exit 1, empty stdout, first line
# of stderr matching ^PREFIX_RE and containing SUBSTRING.
expect_reject() {
    local f=$1 re=$2 sub=${3:-} sf
    sf=$(short "$f")
    run "$f"
    if [ "$rc" -ne 1 ]; then
        fail "$sf: expected exit 1, got $(describe)"
    elif [ -s "$OUT" ]; then
        fail "$sf: rejected but wrote to stdout: $(head -c 200 "$OUT")"
    elif ! [[ $msg =~ ^$re ]]; then
        fail "$sf: message does not start with the path (and location, if any): $(short "$msg")"
    elif [ -n "$sub" ] && [[ $msg != *"$sub"* ]]; then
        fail "$sf: message lacks '$sub': $(short "$msg")"
    else
        pass
    fi
}

# A path as a literal regular expression.
re_quote() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|/]/\\&/g'; }

# ---- 1. the committed corpus ------------------------------------------------
shopt -s nullglob
files=("$BAD_DIR"/*.ir)
if [ ${#files[@]} -eq 0 ]; then fail "$BAD_DIR: no *.ir files"; fi
for f in "${files[@]}"; do
    first=$(head -n 1 "$f" | tr -d '\000')
    if ! [[ $first =~ ^#\ EXPECT:\ ([0-9]+):([0-9]+):\ (.+)$ ]]; then
        fail "$f: first line is not '# EXPECT: LINE:COL: SUBSTRING'"
        continue
    fi
    line=${BASH_REMATCH[1]}
    col=${BASH_REMATCH[2]}
    sub=${BASH_REMATCH[3]}
    cmdline=()
    second=$(sed -n 2p "$f" | tr -d '\000')
    if [[ $second =~ ^#\ ARGS:\ (.+)$ ]]; then read -r -a cmdline <<<"${BASH_REMATCH[1]}"; fi
    run "$f" "${cmdline[@]}"
    prefix="$f:$line:$col: error: "
    if [ "$rc" -ne 1 ]; then
        fail "$f: expected exit 1, got $(describe)"
    elif [ -s "$OUT" ]; then
        fail "$f: rejected but wrote to stdout: $(head -c 200 "$OUT")"
    elif [[ $msg != "$prefix"* ]]; then
        fail "$f: expected '$prefix...$sub', got: $msg"
    elif [[ $msg != *"$sub"* ]]; then
        fail "$f: message lacks '$sub': $msg"
    else
        pass
    fi
done

# ---- 2. generated inputs -----------------------------------------------------
LOC_RE='[0-9]+:[0-9]+: error: .'

# Binary garbage from a fixed linear congruential generator: the same bytes
# on every run.
gen_bytes() {   # gen_bytes SEED COUNT ALPHABET -> stdout ("" = all 256 bytes)
    local seed=$1 count=$2 alpha=$3 s="" e i b
    for ((i = 0; i < count; i++)); do
        seed=$(((seed * 1103515245 + 12345) & 0x7fffffff))
        b=$(((seed >> 16) & 255))
        if [ -n "$alpha" ]; then
            s+=${alpha:$((b % ${#alpha})):1}
        else
            printf -v e '\\0%03o' "$b"
            s+=$e
        fi
    done
    if [ -n "$alpha" ]; then printf '%s' "$s"; else printf '%b' "$s"; fi
}
g=$GEN_DIR/garbage.ir
gen_bytes 1 4096 "" >"$g"
expect_reject "$g" "$(re_quote "$g"):$LOC_RE"
g=$GEN_DIR/garbage_after_header.ir
{ printf 'module m\ninput x : f32[2, 3]\n'; gen_bytes 7 4096 ""; } >"$g"
expect_reject "$g" "$(re_quote "$g"):$LOC_RE"
# Garbage made of the format's own characters, so the parser (not only the
# lexer) sees it.
g=$GEN_DIR/garbage_tokens.ir
{ printf 'module m\ninput x : f32[2, 3]\n'; gen_bytes 3 4096 '()[]{},=:-.0123456789 xfe_"#
'; } >"$g"
expect_reject "$g" "$(re_quote "$g"):$LOC_RE"

# Over the 64 MiB source limit (70 MB of spaces): refused before parsing, and
# the message says why.
g=$GEN_DIR/too_big.ir
head -c 70000000 /dev/zero | tr '\0' ' ' >"$g"
expect_reject "$g" "$(re_quote "$g"): error: " "limit"
rm -f "$g"

# Deep nesting: nothing may recurse per bracket.
g=$GEN_DIR/deep_brackets.ir
{ printf 'module m\ninput x : f32[2, 3]\nr = reshape(x, shape='; head -c 100000 /dev/zero | tr '\0' '['; printf '\n'; } >"$g"
expect_reject "$g" "$(re_quote "$g"):3:23: error: " "lists do not nest"
g=$GEN_DIR/deep_brackets_in_type.ir
{ printf 'module m\ninput x : f32'; head -c 100000 /dev/zero | tr '\0' '['; printf '\n'; } >"$g"
expect_reject "$g" "$(re_quote "$g"):2:15: error: " "expected a dimension"
g=$GEN_DIR/deep_parens.ir
{ printf 'module m\ninput x : f32[2, 3]\nh = relu'; head -c 100000 /dev/zero | tr '\0' '('; printf 'x\n'; } >"$g"
expect_reject "$g" "$(re_quote "$g"):3:10: error: " "expected an operand"

# A 10000-character identifier.
g=$GEN_DIR/long_identifier.ir
{ printf 'module m\ninput '; head -c 10000 /dev/zero | tr '\0' 'a'; printf ' : f32[2]\n'; } >"$g"
expect_reject "$g" "$(re_quote "$g"):2:7: error: " "identifier longer than 256 characters"

# A long (but legal) path: the message must still start with all of it.
d=$GEN_DIR/long_path
while [ ${#d} -lt 1200 ]; do d=$d/$(printf '%0100d' 0 | tr 0 d); done
mkdir -p "$d"
g=$d/bad.ir
printf 'module m\nh = relu(y)\n' >"$g"
expect_reject "$g" "$(re_quote "$g"):2:10: error: " "undefined value 'y'"

# Not a file, and no file.
g=$GEN_DIR/a_directory.ir
mkdir -p "$g"
expect_reject "$g" "$(re_quote "$g"): error: " "not a regular file"
g=$GEN_DIR/does_not_exist.ir
rm -rf "$g"
expect_reject "$g" "$(re_quote "$g"): error: " "cannot open"

# ---- 3. valid inputs at the edges --------------------------------------------
# An empty file is rejected at 1:1: a model with no statements is a mistake
# (a wrong path, a truncated copy), not an empty module. (A file of only
# comments is in BAD_DIR: empty_only_comments.ir.)
g=$GEN_DIR/empty.ir
: >"$g"
expect_reject "$g" "$(re_quote "$g"):1:1: error: " "the model is empty"

# 20000 chained relu ops: parse + verify + print must be fast, and the printed
# text must be a fixed point of print.
g=$GEN_DIR/relu_chain.ir
{
    printf 'module chain\ninput x : f32[4, 8]\nv0 = relu(x)\n'
    for ((i = 1; i < 20000; i++)); do printf 'v%d = relu(v%d)\n' "$i" "$((i - 1))"; done
    printf 'output y = v19999\n'
} >"$g"
t0=$(date +%s%N)
run "$g"
t1=$(date +%s%N)
ms=$(((t1 - t0) / 1000000))
if [ "$rc" -ne 0 ]; then
    fail "$g: a chain of 20000 relu ops must be accepted, got $(describe)"
elif [ "$(grep -c '= relu(' "$OUT")" -ne 20000 ]; then
    fail "$g: printed $(grep -c '= relu(' "$OUT") relu ops, expected 20000"
else
    cp "$OUT" "$GEN_DIR/relu_chain.printed.ir"
    run "$GEN_DIR/relu_chain.printed.ir"
    if [ "$rc" -ne 0 ]; then fail "$g: the printed text does not parse: $(describe)"
    elif ! cmp -s "$OUT" "$GEN_DIR/relu_chain.printed.ir"; then fail "$g: printing is not a fixed point"
    else pass
    fi
fi
echo "relu_chain (20000 ops): print took ${ms} ms"

rm -f "$OUT" "$ERR"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
