# The Debian package (cpack -G DEB) holds what ci/deb-check.sh installs on a clean Debian: the tool,
# the libraries and headers, the CMake package, the fixture and the engine adapters, with its run-time
# dependencies read off the binary.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_CPACK_COMMAND} -G DEB -B ${WORK_DIR} -D CPACK_OUTPUT_FILE_PREFIX=${WORK_DIR}
                        --config ${BINARY_DIR}/CPackConfig.cmake
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cpack failed (${rc}):\n${out}\n${err}")
endif()
file(GLOB debs ${WORK_DIR}/tinygpt-verify_*_amd64.deb)
list(LENGTH debs n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected one .deb in ${WORK_DIR}, found ${n}")
endif()
execute_process(COMMAND dpkg-deb --contents ${debs} OUTPUT_VARIABLE contents RESULT_VARIABLE rc)
execute_process(COMMAND dpkg-deb --field ${debs} Depends OUTPUT_VARIABLE depends)
foreach(path ./usr/bin/tinygpt ./usr/share/tinygpt/golden/fixture.safetensors ./usr/share/tinygpt/golden/tokenizer.json
             ./usr/lib/cmake/tinygpt/tinygptConfig.cmake ./usr/include/tinygpt/checks/check_suite.h ./usr/include/tinygpt/gpt.h
             ./usr/lib/libtinygpt_checks.a ./usr/share/tinygpt/engines/onnxruntime/export_onnx.py)
  string(FIND "${contents}" " ${path}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${debs} lacks ${path}")
  endif()
endforeach()
foreach(dep libtorch libopenblas0-openmp libpcre2-8-0)
  string(FIND "${depends}" "${dep}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${debs} does not depend on ${dep}: ${depends}")
  endif()
endforeach()
message(STATUS "${debs}: every path present; Depends: ${depends}")
