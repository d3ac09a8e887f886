#!/usr/bin/env bash
# A = the old build (its own binary and library), B = the new one; interleaved
cd /work/main
for r in 1 2 3 4 5; do
  for m in resnet mlp small_conv small_mlp small_gpt gpt; do
    for mode in infer train; do
      for v in A B; do
        if [ $v = A ]; then bin=/tmp/old/build/tfuse; else bin=/work/main/build/tfuse; fi
        it=100; [ $m = gpt ] && it=30; [ $m = resnet ] && [ $mode = train ] && it=40
        ms=$($bin bench bench/models/$m.ir --mode=$mode --target=cpu --threads 2 --iters $it --warmup 5 | sed -n 's/^step_ms: //p')
        echo "$r $m $mode $v $ms"
      done
    done
  done
done
