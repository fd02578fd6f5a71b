#!/bin/sh
# test-ops-fake.sh - the op harness against a second device: a fake device
# (CPU kernels behind a non-host buffer type). Every source and target of a
# case lives in the device's memory, so the scheduler runs each op the
# device claims on the device, and the harness asserts that it did; the
# results are compared with the reference and, element by element, with the
# CPU. The device comes from TSR_TEST_DEVICE, as tests/test-ops-cuda.sh and
# the GPU script (tests/gpu/check.sh) choose CUDA0.
#
# Then the harness must be able to fail: for each op the fake device runs,
# TSR_FAKE_FAULT=op moves one element of that op's outputs by 1% (cpu/fake.c)
# and `test-ops -d FAKE0 -o op` must fail.
bin=${top_builddir:-.}/tests/test-ops
export TSR_FAKE_DEVICES=FAKE0:1GiB
TSR_TEST_DEVICE=FAKE0 "$bin" || exit 1
ops="add sub mul div scale mul_mat get_rows set_rows rms_norm norm rope softmax silu gelu swiglu geglu concat
     cpy cont flash_attn mul_mat_id argsort top_k sigmoid sum_rows"
missed=
for op in $ops; do
    TSR_FAKE_FAULT=$op "$bin" -d FAKE0 -o "$op" > /dev/null 2>&1
    rc=$?
    if [ $rc -ne 1 ]; then
        echo "FAIL: TSR_FAKE_FAULT=$op: test-ops -d FAKE0 -o $op exited $rc, not 1 (a wrong $op went unseen)"
        missed="$missed $op"
    fi
done
[ -z "$missed" ] || exit 1
echo "a 1% fault in each of the device's ops fails the harness: $(echo $ops | wc -w) ops"
