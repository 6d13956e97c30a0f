# Sixth device call of the eleventh session: int/next17 (main 34c9fbc + h/outsingle + the default
# flipped on): gpu_backend_test in full and the service on cuda, with the switch unset.
mkdir -p .device-lead && tar -C .device-lead -xJf .device-pack/next17.tar.xz && export BUNDLE=$PWD/.device-lead LD_LIBRARY_PATH=$PWD/.device-lead/lib
T=.device-lead/tests
echo "commit $(cat .device-lead/COMMIT)"
unset TANDEM_DENSE_OUT_SINGLE
timeout 100 $T/gpu_backend_test > $OUT/backend.log 2>&1; echo "gpu_backend_test rc=$?"; grep -E "routing agreement|prepared dense|^\[  (PASSED|FAILED)|FAILED" $OUT/backend.log | cut -c1-200 | grep -v "f32 \|f16 dense" | head -24
s=$(mktemp -d); mkdir -p $s/gpu_service $s/tests/service; ln -s $PWD/.device-lead/bin/tandem-gpu-service $s/gpu_service/tandem-gpu-service
TANDEM_TEST_BINARY_DIR=$s TANDEM_TEST_BACKEND=cuda timeout 60 $T/service_integration_test > $OUT/service.log 2>&1; echo "service on cuda rc=$?"; grep -E "^\[  (PASSED|FAILED)" $OUT/service.log
(cd $OUT && tar -cJf logs.tar.xz *.log --remove-files)
