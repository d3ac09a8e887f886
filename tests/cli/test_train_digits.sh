#!/usr/bin/env bash
# test_train_digits.sh TFUSE REPO TMPDIR — training learns: examples/mlp.ir
# (--dim F=64) trained for 300 steps on scikit-learn's bundled 8x8 digits
# (scripts/make_digits.py: 1500 training, 297 held-out images) must reach a
# held-out accuracy of at least 0.9, and its loss must fall.
set -u
tfuse=$1 repo=$2 tmp=$3
rm -rf "$tmp"
mkdir -p "$tmp"
python3 "$repo/scripts/make_digits.py" "$tmp/digits" || { echo "FAILED: scripts/make_digits.py"; exit 1; }
d=$tmp/digits
out=$("$tfuse" train "$repo/examples/mlp.ir" --dim F=64 --steps 300 --log-every 50 --log "$tmp/digits.csv" \
  --data "x=$d/train_x.npy,y=$d/train_y.npy" --eval-data "x=$d/test_x.npy,y=$d/test_y.npy" 2>&1)
rc=$?
echo "$out"
if [ $rc -ne 0 ]; then echo "FAILED: tfuse train exited $rc"; exit 1; fi
acc=$(sed -n 's/^eval after step 300: .* accuracy \([0-9.]*\) .*/\1/p' <<<"$out")
if [ -z "$acc" ]; then echo "FAILED: no held-out accuracy in the output"; exit 1; fi
# mean loss of the first and the last 20 steps, from the CSV log
read -r first last < <(awk -F, 'NR > 1 && NR <= 21 { a += $3 } NR > 281 { b += $3 } END { printf "%f %f\n", a / 20, b / 20 }' "$tmp/digits.csv")
echo "held-out accuracy $acc; mean training loss $first over steps 1-20, $last over steps 281-300"
if ! awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }'; then echo "FAILED: held-out accuracy $acc < 0.9"; exit 1; fi
if ! awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f / 4) }'; then echo "FAILED: the loss did not fall to a quarter"; exit 1; fi
echo "passed"
