# Every test runs through tests/timed.py, which records its wall and CPU seconds under
# build/test-times/ (ctest records wall time only; on two cores a test that keeps two threads busy
# costs twice its wall time). ci/test-times.py reads them beside ctest's JUnit report.
set(TINYGPT_TIMES_DIR ${PROJECT_BINARY_DIR}/test-times)
# The prefix of every add_test command: add_test(NAME n COMMAND ${TINYGPT_TIMED} n -- COMMAND...).
set(TINYGPT_TIMED /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/timed.py ${TINYGPT_TIMES_DIR})

# The tests gtest_discover_tests finds in a target run through the recorder too (named by the binary
# and its --gtest_filter, as ctest names them with TEST_PREFIX "<target>.").
function(tinygpt_time_gtests target)
  set_property(TARGET ${target} PROPERTY CROSSCOMPILING_EMULATOR ${TINYGPT_TIMED} @gtest --)
endfunction()

# A test that runs longer than the budget (120 s on the 2-core machine, ci/test-times.py --budget)
# says why in its CMake line; ci/test-times.py lists the tests over it without a reason and fails.
file(WRITE ${PROJECT_BINARY_DIR}/test-slow-reasons.txt "")
# A slow test also starts before the short ones (ctest runs the costliest first where it has no timings
# of its own, as on a fresh clone): begun last, one of them keeps a core busy alone at the end.
function(tinygpt_slow_test name reason)
  file(APPEND ${PROJECT_BINARY_DIR}/test-slow-reasons.txt "${name}\t${reason}\n")
  if(TEST ${name})
    get_test_property(${name} COST cost)
    if(NOT cost OR cost LESS 3000)
      set_tests_properties(${name} PROPERTIES COST 3000)
    endif()
  endif()
endfunction()
