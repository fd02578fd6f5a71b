#!/bin/sh
# test-ops-fake.sh - the op harness against a second device: a fake device
# (CPU kernels behind a non-host buffer type, so every input crosses a device
# boundary through the scheduler), compared with the reference and with the CPU.
# The device comes from TSR_TEST_DEVICE, as tests/test-ops-cuda.sh and the GPU
# script (tests/gpu/check.sh) choose CUDA0.
TSR_FAKE_DEVICES=FAKE0:1GiB TSR_TEST_DEVICE=FAKE0 exec "${top_builddir:-.}/tests/test-ops"
