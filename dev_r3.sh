#!/usr/bin/env bash
set -u
T0=$(date +%s)
B=$(mktemp -d); tar -xJf .device-pack/r3.tar.xz -C $B
export LD_LIBRARY_PATH=$B/lib
O=$OUT/r3; mkdir -p $O
$B/bin/tandem gen-model --preset q3n-80b --out /dev/shm/q3n-80b.gguf --threads $(nproc) > $O/gen.txt 2>&1
MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout 200 bash scripts/device/ab_80b.sh --rounds 3 --bench "--batches 1 --prefill 512 --decode-steps 32" 'all:' 'gdn:TANDEM_ROUTE_THROUGH_OUT=1' 'old:TANDEM_ROUTE_THROUGH_OUT=0' > $O/ab.txt 2>&1
echo "t=$(( $(date +%s) - T0 ))" >> $O/ab.txt
MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout 250 bash scripts/device/timeline_80b.sh > $O/tl.log 2>&1; echo "rc=$? t=$(( $(date +%s) - T0 ))" >> $O/tl.log
cd $OUT && tar -czf r3.tgz r3
