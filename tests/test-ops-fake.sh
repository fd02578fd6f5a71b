#!/bin/sh
# test-ops-fake.sh - the op harness against a second device: a fake device
# (CPU kernels behind a non-host buffer type, so every input crosses a device
# boundary through the scheduler), compared with the reference and with the CPU.
TSR_FAKE_DEVICES=FAKE0:1GiB exec "${top_builddir:-.}/tests/test-ops" -d FAKE0
