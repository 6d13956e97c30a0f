#!/usr/bin/env bash
set -u
T0=$(date +%s)
B=$(mktemp -d); tar -xJf .device-pack/r1.tar.xz -C $B
export LD_LIBRARY_PATH=$B/lib
O=$OUT/r1; mkdir -p $O
( $B/bin/tandem gen-model --preset q3n-80b --out /dev/shm/q3n-80b.gguf --threads $(nproc) > $O/gen.txt 2>&1 ) &
GEN=$!
timeout 120 $B/tests/gpu_kernels_test --gtest_filter='*RouteCompose*:*NormRoute*:*MergedSlices*:*Streams*' > $O/kt.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/kt.txt
timeout 200 $B/tests/gpu_backend_test --gtest_filter='*RouteThroughOut*:*OutByColumns*' > $O/bt.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/bt.txt
wait $GEN
MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout 200 bash scripts/device/ab_80b.sh --rounds 3 --bench "--batches 1 --prefill 512 --decode-steps 32" 'new:' 'old:TANDEM_ROUTE_THROUGH_OUT=0' 'merge:TANDEM_ATTN_MERGE_IN_BLOCK=1' > $O/ab.txt 2>&1
echo "t=$(( $(date +%s) - T0 ))" >> $O/ab.txt
cd $OUT && tar -czf r1.tgz r1
