# Included by the tests that configure and build an outside project against the installed package
# (consumer_test.cmake, conformance_test.cmake): when the suite's own build compiles through ccache
# (CCACHE names it; ci/build.sh), the outside project does too, so a later run of the same sources
# takes its objects from the cache. The base folder keeps the checkout's path out of the key; the
# installed headers are fresh copies every run, so their file times are not compared.
set(OUTSIDE_LAUNCHER)
if(CCACHE)
  set(ENV{CCACHE_BASEDIR} ${SOURCE_DIR})
  set(ENV{CCACHE_SLOPPINESS} include_file_mtime,include_file_ctime,time_macros)
  set(OUTSIDE_LAUNCHER -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
