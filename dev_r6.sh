#!/usr/bin/env bash
set -u
T0=$(date +%s)
left() { echo $(( 300 - ($(date +%s) - T0) )); }
B=$(mktemp -d); tar -xJf .device-pack/r6.tar.xz -C $B
export LD_LIBRARY_PATH=$B/lib
O=$OUT/r6; mkdir -p $O
( $B/bin/tandem gen-model --preset q3n-80b --out /dev/shm/q3n-80b.gguf --threads $(nproc) > $O/gen.txt 2>&1 ) &
GEN=$!
timeout 150 $B/tests/gpu_backend_test --gtest_filter='*RouteThroughOut*:*OutByColumns*:*GdnOutProductInside*:*AttnOutColumnSplit*:*FusedOneTokenMoe*' > $O/bt.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/bt.txt
wait $GEN
L=$(left); [ $L -gt 40 ] && timeout $(( L - 10 )) $B/tests/gpu_backend_bench --model /dev/shm/q3n-80b.gguf --batches 1 --prefill 512 --decode-steps 64 > $O/b1.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/b1.txt
cd $OUT && tar -czf r6.tgz r6
