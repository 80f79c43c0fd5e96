# CTest's fuzz.<target>: cmake -DFUZZER=<exe> -DCORPUS=<dir> -DSCRATCH=<dir> -DRUNS=<n>
#   -P run_fuzz_test.cmake
# Runs every input of the committed corpus once (-runs=0 loads and executes it, no
# mutation), then RUNS mutations of it. libFuzzer writes the inputs it finds to the FIRST
# corpus directory: that is SCRATCH, emptied first, so the committed corpus never changes.
# The limits are those of the long runs (docs/wire-protocol.md): a declared size that
# allocates more than 64 MiB at once is a failure, not a slow test.
foreach(var FUZZER CORPUS SCRATCH RUNS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzz_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT IS_DIRECTORY "${CORPUS}")
  message(FATAL_ERROR "run_fuzz_test.cmake: no corpus at ${CORPUS}")
endif()
file(REMOVE_RECURSE "${SCRATCH}")
file(MAKE_DIRECTORY "${SCRATCH}")
set(limits -rss_limit_mb=2048 -malloc_limit_mb=64 -timeout=25 -max_len=8192)

execute_process(COMMAND "${FUZZER}" ${limits} -runs=0 "${CORPUS}" RESULT_VARIABLE replay)
if(NOT replay EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed on an input of the committed corpus ${CORPUS} "
                      "(exit ${replay}; the input is named above)")
endif()
execute_process(COMMAND "${FUZZER}" ${limits} -seed=1 -runs=${RUNS} "${SCRATCH}" "${CORPUS}"
                WORKING_DIRECTORY "${SCRATCH}" RESULT_VARIABLE fuzzed)
if(NOT fuzzed EQUAL 0)
  message(FATAL_ERROR "${FUZZER} found a failing input in ${RUNS} runs (exit ${fuzzed}; the "
                      "crash-* file is in ${SCRATCH})")
endif()
