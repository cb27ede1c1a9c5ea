# Installs the built package into a scratch prefix, then configures, builds and runs the outside
# project in lib/examples/conformance against it. PLANTED=ON builds its planted-bug variant, which
# must FAIL with tinygpt's diagnostics (the failing check and position; RapidCheck's counterexample).
file(REMOVE_RECURSE ${WORK_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/outside_ccache.cmake)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/lib/examples/conformance -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DPLANTED_BUG=${PLANTED} ${OUTSIDE_LAUNCHER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
if(NOT PLANTED)
  execute_process(COMMAND ${WORK_DIR}/build/conformance_tests RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the example's own cache and sampler should pass the kit (exit ${rc}):\n${out}\n${err}")
  endif()
  return()
endif()
# The planted build: a cache that never trims, a nucleus that drops the token reaching top_p.
execute_process(COMMAND ${WORK_DIR}/build/conformance_tests
  "--gtest_filter=PagedCache/KVCacheConformance.window_reference/untrained_cpu:PagedCache/KVCacheConformance.LengthAndBytesFollowTheFormula/untrained_cpu:LoopSampler/SamplerLaw.Holds/survivorsMatchTheSpec6Model_cpu"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the planted bugs passed the kit:\n${out}\n${err}")
endif()
foreach(expect "FAIL window-reference: production loop vs banded reference, every step: first over 1.00e-04 at position"
               "tokens fed"
               "Falsifiable after" "survivorsMatchTheSpec6Model"
               "3 FAILED TESTS")
  string(FIND "${out}${err}" "${expect}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the kit failed the planted build, but without '${expect}' in its report:\n${out}\n${err}")
  endif()
endforeach()
