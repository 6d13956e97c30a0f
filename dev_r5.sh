#!/usr/bin/env bash
set -u
T0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - T0) )); }
B=$(mktemp -d); tar -xJf .device-pack/r5.tar.xz -C $B
export LD_LIBRARY_PATH=$B/lib
O=$OUT/r5; mkdir -p $O
( $B/bin/tandem gen-model --preset q3n-80b --out /dev/shm/q3n-80b.gguf --threads $(nproc) > $O/gen.txt 2>&1 ) &
GEN=$!
timeout 60 $B/tests/gpu_kernels_test --gtest_filter='*RouteCompose*:*NormRoute*' > $O/kt.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/kt.txt
wait $GEN
MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout 160 bash scripts/device/ab_80b.sh --rounds 3 --bench "--batches 1 --prefill 512 --decode-steps 32" 'all:' 'gdn:TANDEM_ROUTE_THROUGH_OUT=1' 'old:TANDEM_ROUTE_THROUGH_OUT=0' > $O/ab.txt 2>&1
echo "t=$(( $(date +%s) - T0 ))" >> $O/ab.txt
a=$(grep -E '^all +decode batch 1' $O/ab.txt | awk '{print $NF}')
g=$(grep -E '^gdn +decode batch 1' $O/ab.txt | awk '{print $NF}')
win="TANDEM_ROUTE_THROUGH_OUT=2"
if [ -n "$a" ] && [ -n "$g" ] && awk -v a="$a" -v g="$g" 'BEGIN{exit !(g > a)}'; then win="TANDEM_ROUTE_THROUGH_OUT=1"; fi
echo "chosen: $win" > $O/win.txt
L=$(left); [ $L -gt 100 ] && env $win MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout $(( L - 60 )) bash scripts/device/bench_80b.sh > $O/bench.log 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/bench.log
L=$(left)
if [ $L -gt 15 ]; then
  stand_in=$(mktemp -d); mkdir -p $stand_in/gpu_service $stand_in/tests/service
  ln -s $B/bin/tandem-gpu-service $stand_in/gpu_service/tandem-gpu-service
  env $win TANDEM_TEST_BINARY_DIR=$stand_in TANDEM_TEST_BACKEND=cuda timeout $L $B/tests/service_integration_test > $O/svc.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/svc.txt
fi
L=$(left); [ $L -gt 30 ] && env $win timeout $(( L - 10 )) $B/tests/gpu_backend_test > $O/bt.txt 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/bt.txt
cd $OUT && tar -czf r5.tgz r5
