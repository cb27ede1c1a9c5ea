# One ctest test per GoogleTest suite of a test binary: "<target>.<Suite>" runs "--gtest_filter=<Suite>.*".
# Every test process pays LibTorch's start-up (its operator registrations: about 0.4 s of CPU on the
# 2-core machine, 0.44 s for `unit_model --gtest_list_tests`), and most of our test cases take less than
# that: one process per case spent more on starting than on testing (unit_model: 175 processes, 152 of
# them under a second). A failing case is still named, in the suite's output (ctest --output-on-failure).
#
# The suites are listed after each build of the target (its --gtest_list_tests, by this file run as a
# script), as gtest_discover_tests lists cases; ctest reads the list through an include file written at
# configure time, and a target not built yet shows as one failing <target>_NOT_BUILT test.
#
#   tinygpt_gtest_suites(TARGET LABEL)    in a CMakeLists.txt, after add_executable(TARGET ...)
#   cmake -DEXE=... -DOUT=... -P GTestSuites.cmake    (the POST_BUILD step)

if(CMAKE_SCRIPT_MODE_FILE)
  execute_process(COMMAND "${EXE}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 60)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} --gtest_list_tests exited ${rc}")
  endif()
  # "Suite.\n  Case\n", "Prefix/Suite.  # TypeParam = ...", "Suite/Param."
  string(REPLACE "\n" ";" lines "${listing}")
  set(suites "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^ #][^ ]*)\\.")
      list(APPEND suites "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES suites)
  file(WRITE "${OUT}.tmp" "set(tinygpt_suites [=[${suites}]=])\n")
  file(RENAME "${OUT}.tmp" "${OUT}")
  return()
endif()

set(TINYGPT_GTEST_SUITES_SCRIPT ${CMAKE_CURRENT_LIST_FILE})

function(tinygpt_gtest_suites target label)
  set(list_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake)
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake)
  add_custom_command(TARGET ${target} POST_BUILD BYPRODUCTS ${list_file}
                     COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:${target}> -DOUT=${list_file} -P ${TINYGPT_GTEST_SUITES_SCRIPT}
                     VERBATIM)
  # What each suite's test runs: the timing recorder (TestTimes.cmake), then the binary with its filter.
  string(JOIN "]=] [=[" timed ${TINYGPT_TIMED})
  file(GENERATE OUTPUT ${include_file} CONTENT
"if(EXISTS [=[${list_file}]=])
  include([=[${list_file}]=])
  foreach(suite IN LISTS tinygpt_suites)
    set(name \"${target}.\${suite}\")
    add_test(\"\${name}\" [=[${timed}]=] \"\${name}\" -- [=[$<TARGET_FILE:${target}>]=] \"--gtest_filter=\${suite}.*\")
    set_tests_properties(\"\${name}\" PROPERTIES LABELS [=[${label}]=] ENVIRONMENT [=[${TINYGPT_TEST_ENV}]=]
                         WORKING_DIRECTORY [=[${PROJECT_SOURCE_DIR}]=])
  endforeach()
else()
  add_test([=[${target}_NOT_BUILT]=] [=[${target}_NOT_BUILT]=])
endif()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
