#!/usr/bin/env bash
# test_one_place.sh SRC — facts the tree keeps in one place stay there
# (docs/design.md, "Where things live"):
#   - the library reads the environment only through tf_env (ir/env.c);
#   - no library file outside ir/ sorts ops by naming several of them in one
#     case list: ops.def's EXEC column says how each op executes.
set -u
src=$1
fail=0
hits=$(grep -rn --include='*.c' --include='*.h' 'getenv *(' "$src/ir" "$src/frontend" "$src/passes" "$src/codegen" "$src/runtime" \
       | grep -v "^$src/ir/env.c:")
if [ -n "$hits" ]; then
  echo "FAILED: getenv outside ir/env.c (read the environment through tf_env, and declare the variable in env.c's table):"
  echo "$hits"
  fail=1
fi
# a case list of three or more ops on one line is an op class written out by hand
hits=$(grep -rnE --include='*.c' 'case TF_OP_[A-Z0-9_]+: *case TF_OP_[A-Z0-9_]+: *case TF_OP_' "$src/passes/fuse.c" "$src/passes/memplan.c" \
       "$src/codegen/kernel.c" "$src/runtime/context.c" "$src/runtime/cpu" "$src/runtime/cuda")
if [ -n "$hits" ]; then
  echo "FAILED: ops listed by hand where ops.def's EXEC column (tf_op_exec_of) answers:"
  echo "$hits"
  fail=1
fi
[ $fail = 0 ] && echo "one place: the environment through tf_env only; no op class lists"
exit $fail
