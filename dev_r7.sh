#!/usr/bin/env bash
set -u
T0=$(date +%s)
B=$(mktemp -d); tar -xJf .device-pack/r7.tar.xz -C $B
export LD_LIBRARY_PATH=$B/lib
O=$OUT/r7; mkdir -p $O
[ -f /dev/shm/q3n-80b.gguf ] || $B/bin/tandem gen-model --preset q3n-80b --out /dev/shm/q3n-80b.gguf --threads $(nproc) > $O/gen.txt 2>&1
MODEL_DIR=/dev/shm OUT=$O BUNDLE=$B timeout 150 bash scripts/device/ab_80b.sh --rounds 2 --bench "--batches 1 --prefill 512 --decode-steps 32" 'gdn:' 'all:TANDEM_ROUTE_THROUGH_OUT=2' 'all-early:TANDEM_ROUTE_THROUGH_OUT=2 TANDEM_COLSPLIT_ALLOW_EARLY=1' 'gdn-early:TANDEM_COLSPLIT_ALLOW_EARLY=1' > $O/ab.txt 2>&1
echo "t=$(( $(date +%s) - T0 ))" >> $O/ab.txt
cd $OUT && tar -czf r7.tgz r7
