"""test_python.py DIR — the Python package's data parallel, as an Open MPI job
(tests/mpi/run.sh runs it on 2 ranks): Communicator.launched() and .mpi(), a
program compiled with data_parallel=True trained for 3 steps with each
rank's own batch, the ranks' states compared through files in DIR (every
rank writes its hash and reads the others'); a program without
data_parallel refused with the library's message. Exit 0 when all held."""
import hashlib
import os
import sys
import time

import numpy as np
import tfuse

MODEL = """dim B = 4
input x : f32[B, 6]
input y : i64[B]
param w : f32[6, 3] = kaiming_uniform()
param b : f32[3] = zeros()
lg = linear(x, w, b)
loss = cross_entropy(lg, y)
output loss
train {
  optimizer = adam(lr=0.01)
  precision = fp32
}
"""


def main():
    out = sys.argv[1]
    failures = []
    launched = tfuse.Communicator.launched()
    if not launched or launched[1] < 2:
        print(f"not launched as one of several ranks: {launched}")
        return 1
    comm = tfuse.Communicator.mpi()
    rank, size = comm.rank, comm.size
    if (rank, size) != launched:
        failures.append(f"MPI says rank {rank} of {size}, the launcher {launched}")
    prog = tfuse.compile(MODEL, mode="train", data_parallel=True, allreduce_bucket="16")   # cpu, or interp without LLVM
    sess = prog.session(seed=7, comm=comm)
    rng = np.random.default_rng(100 + rank)
    for _ in range(3):
        sess.train_step(x=rng.standard_normal((4, 6)).astype(np.float32), y=rng.integers(0, 3, 4))
    h = hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for _, v in sorted(sess.state_dict().items()))).hexdigest()
    with open(os.path.join(out, f"rank{rank}.tmp"), "w") as f:
        f.write(h)
    os.replace(os.path.join(out, f"rank{rank}.tmp"), os.path.join(out, f"rank{rank}"))
    deadline = time.monotonic() + 60
    hashes = {}
    while len(hashes) < size and time.monotonic() < deadline:
        for r in range(size):
            p = os.path.join(out, f"rank{r}")
            if r not in hashes and os.path.exists(p):
                hashes[r] = open(p).read()
        time.sleep(0.05)
    if len(hashes) < size:
        failures.append(f"only ranks {sorted(hashes)} wrote their state's hash")
    elif len(set(hashes.values())) != 1:
        failures.append(f"the ranks' states differ: {hashes}")
    plain = tfuse.compile(MODEL, mode="train")
    try:
        plain.session(comm=comm)
        failures.append("a program without data_parallel was accepted by a job of several ranks")
    except tfuse.Error as e:
        if "without data_parallel" not in str(e):
            failures.append(f"the refusal says: {e}")
    sess.close()
    comm.close()
    for f in failures:
        print(f"rank {rank}: FAILED: {f}")
    print(f"rank {rank} of {size}: {'ok' if not failures else 'failed'} (state {hashes.get(rank, '?')[:16]})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
