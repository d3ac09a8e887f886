#!/bin/sh
# run.sh MPIRUN NP EXPECT PROGRAM [ARGS...] — run PROGRAM as an Open MPI job
# of NP ranks on this machine, and judge it by EXPECT:
#   ok      the job exits 0;
#   <text>  the job exits non-zero (it was aborted) and its output holds
#           <text> (a fixed string).
# --oversubscribe: more ranks than cores is the point on a small machine.
# --allow-run-as-root: mpirun refuses root otherwise (containers, CI).
# Open MPI's defaults otherwise: they work in a container whose only
# interface is lo (checked under `unshare -n` with lo up; with lo down too,
# PMIx cannot start at all). Where a container forbids process_vm_readv
# (some Docker setups; Open MPI then fails with "Read -1, expected ...,
# errno = 1"), shared memory's single copy cannot work: set
# OMPI_MCA_btl_vader_single_copy_mechanism=none in the environment.
# Whatever Open MPI prints besides (container warnings, help texts) is shown
# but judged by neither EXPECT.
set -u
mpirun=$1 np=$2 expect=$3
shift 3
root=""
[ "$(id -u)" = 0 ] && root=--allow-run-as-root
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
"$mpirun" $root --oversubscribe -np "$np" "$@" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
cat "$out"
echo "run.sh: mpirun -np $np $*: exit $rc after ${took} s"
if [ "$expect" = ok ]; then
  [ $rc = 0 ] && exit 0
  echo "FAILED: the job exited $rc"
  exit 1
fi
if [ $rc = 0 ]; then
  echo "FAILED: the job exited 0; it should have been aborted"
  exit 1
fi
if ! grep -qF -- "$expect" "$out"; then
  echo "FAILED: the job's output lacks: $expect"
  exit 1
fi
exit 0
