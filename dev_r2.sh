#!/usr/bin/env bash
set -u
T0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - T0) )); }
B=$(mktemp -d); tar -xJf .device-pack/r2.tar.xz -C $B
export LD_LIBRARY_PATH=$B/lib
O=$OUT/r2; mkdir -p $O
( $B/bin/tandem gen-model --preset q3n-80b --out /dev/shm/q3n-80b.gguf --threads $(nproc) > $O/gen.txt 2>&1 ) &
GEN=$!
timeout 60 $B/tests/gpu_kernels_test --gtest_filter='*RouteCompose*:*NormRoute*:*ColumnSplit*' > $O/kt.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/kt.txt
wait $GEN
MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout 120 bash scripts/device/ab_80b.sh --rounds 3 --bench "--batches 1 --prefill 512 --decode-steps 32" 'new:' 'old:TANDEM_ROUTE_THROUGH_OUT=0' > $O/ab.txt 2>&1
echo "t=$(( $(date +%s) - T0 ))" >> $O/ab.txt
timeout 240 $B/tests/gpu_backend_test > $O/bt.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/bt.txt
L=$(left); [ $L -gt 100 ] && MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout $(( L - 40 )) bash scripts/device/bench_80b.sh > $O/bench.log 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/bench.log
L=$(left)
if [ $L -gt 20 ]; then
  stand_in=$(mktemp -d); mkdir -p $stand_in/gpu_service $stand_in/tests/service
  ln -s $B/bin/tandem-gpu-service $stand_in/gpu_service/tandem-gpu-service
  TANDEM_TEST_BINARY_DIR=$stand_in TANDEM_TEST_BACKEND=cuda timeout $L $B/tests/service_integration_test > $O/svc.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/svc.txt
fi
cd $OUT && tar -czf r2.tgz r2
