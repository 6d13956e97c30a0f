#!/usr/bin/env bash
# Session 20, call 3: the fused one-token MoE with the shared expert inside (tests, probe, A/B).
set -u
B=$(mktemp -d /tmp/b.XXXX); tar -xJf .device-pack/c3.tar.xz -C "$B"; export LD_LIBRARY_PATH=$B/lib
O=/tmp/o; rm -rf $O; mkdir -p $O
t0=$(date +%s)
timeout 150 "$B/tests/gpu_moe_kernels_test" --gtest_filter='OneTokenFused*' > $O/fused_test.log 2>&1
echo "fused tests rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Failure|inside" $O/fused_test.log | head -30
timeout 100 "$B/tests/gpu_backend_test" --gtest_filter='*FusedOneToken*' > $O/backend_test.log 2>&1
echo "backend tests rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Failure|fused one-token" $O/backend_test.log | head -30
timeout 150 "$B/tests/gpu_moe_bench" --one-token-probe > $O/probe.log 2>&1
echo "probe rc=$? ($(( $(date +%s) - t0 )) s)"; grep "graph" $O/probe.log | grep -E "default|fused"
MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout $(( 560 - ($(date +%s) - t0) )) bash $B/repo/scripts/device/ab_80b.sh --rounds 2 \
  --bench "--batches 1 --prefill 512 --decode-steps 32" 'base:TANDEM_ONE_TOKEN_FUSED=0' 'fused:TANDEM_ONE_TOKEN_FUSED=1' \
  'beside:TANDEM_ONE_TOKEN_FUSED=1 TANDEM_FUSED_SHARED_BESIDE=1' > $O/ab.out 2>&1
echo "ab rc=$? ($(( $(date +%s) - t0 )) s)"
tail -12 $O/ab_80b.txt 2>/dev/null || tail -20 $O/ab.out
tar -czf $OUT/o.tgz -C /tmp o
