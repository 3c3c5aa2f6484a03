set -u
SKIP="ablate sweep ncu decode model sanitize" TESTS_S=120 TESTS="tests/kernels/test_pdl.py tests/kernels/test_gpu_decode.py" \
  BENCH="--formats MXFP8,Q8_0 --ms 32,64 --replays 20" bash tools/kernel_profile.sh $OUT 2>&1 | tail -60
cp $OUT/whl/*.whl .whl/
bash tools/device_tables.sh $OUT/tables 270 - "8b@1,2,4,8,16,32,64,128" --no-tests > $OUT/tables_stdout.log 2>&1
echo "tables: exit $?"; grep -E "check|points|^\[" $OUT/tables/run.log | tail -25
tar -czf $OUT/tables.tar.gz -C $OUT tables tables_stdout.log && rm -rf $OUT/tables $OUT/tables_stdout.log
