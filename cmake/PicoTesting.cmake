# pico_add_test(NAME SOURCES a.cpp b.cpp LIBS lib1 lib2 [LABELS label] [ENVIRONMENT VAR=value]
#               [FILTER gtest-filter])
# One GoogleTest executable, registered with ctest test by test. One label and one
# environment variable at most: gtest_discover_tests flattens list-valued
# properties, which would scramble the property/value pairs.
# PICO_SKIP_TESTS names test programs this build leaves out (scripts/test --sanitize
# --short, CI's sanitized subset, leaves out the engine's numeric and file-format tests).
set(PICO_SKIP_TESTS "" CACHE STRING "Test programs (pico_add_test names) not built in this build directory")
function(pico_add_test name)
  if(NOT PICO_BUILD_TESTS OR name IN_LIST PICO_SKIP_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "LABELS;ENVIRONMENT;FILTER" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main pico_warnings)
  set(properties LABELS "${ARG_LABELS}")
  if(ARG_ENVIRONMENT)
    list(APPEND properties ENVIRONMENT "${ARG_ENVIRONMENT}")
  endif()
  set(filter)
  if(ARG_FILTER)
    set(filter TEST_FILTER "${ARG_FILTER}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST ${filter} PROPERTIES ${properties})
endfunction()
