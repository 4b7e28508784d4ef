# Sanitizer and fuzz builds of the whole tree (each in a build directory of its own:
# scripts/test --sanitize writes build-sanitize/, scripts/fuzz writes build-fuzz/).
#   PICO_SANITIZE  every pico target with ASan + UBSan; the first report aborts the
#                  program (no recovery), so a test that trips one fails.
#   PICO_FUZZ      as PICO_SANITIZE, plus libFuzzer's coverage instrumentation on every
#                  pico library (clang only), and the fuzz targets of tests/fuzz.
# System libraries (Cap'n Proto, ZeroMQ, the C++ runtime) stay as Debian built them.
option(PICO_SANITIZE "Build every pico target with AddressSanitizer + UndefinedBehaviorSanitizer" OFF)

set(PICO_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
if(PICO_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "pico: PICO_FUZZ needs clang (libFuzzer): configure with CC=clang CXX=clang++")
endif()
if(PICO_SANITIZE OR PICO_FUZZ)
  add_compile_options(${PICO_SANITIZER_FLAGS})
  add_link_options(${PICO_SANITIZER_FLAGS})
endif()
if(PICO_FUZZ)
  # Coverage feedback for the fuzzer from every library under test; the targets
  # themselves link libFuzzer's main (-fsanitize=fuzzer, pico_add_fuzz_target).
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# pico_add_fuzz_target(NAME SOURCES a.cpp ... LIBS lib ... [SEEDS seeds.cpp ...]
#                      [ARGS -max_len=N ...] [SECONDS 30])
# A libFuzzer target NAME_fuzz (in a PICO_FUZZ build) and, when SEEDS is given, a
# program NAME_fuzz_seeds that writes its seed corpus into the directory named by its argument.
# ARGS are the libFuzzer options scripts/fuzz passes on every run (written to
# NAME_fuzz.args beside the binary). In every build with tests, ctest gets fuzz_NAME
# (label fuzz): `scripts/fuzz NAME SECONDS`, which builds build-fuzz/ with clang.
function(pico_add_fuzz_target name)
  cmake_parse_arguments(ARG "" "SECONDS" "SOURCES;LIBS;SEEDS;ARGS" ${ARGN})
  if(NOT ARG_SECONDS)
    set(ARG_SECONDS 30)
  endif()
  if(PICO_FUZZ)
    add_executable(${name}_fuzz ${ARG_SOURCES})
    target_compile_options(${name}_fuzz PRIVATE -fsanitize=fuzzer)
    target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer)
    target_link_libraries(${name}_fuzz PRIVATE ${ARG_LIBS} pico_warnings)
    string(REPLACE ";" "\n" args "${ARG_ARGS}")
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/${name}_fuzz.args "${args}\n")
    if(ARG_SEEDS)
      add_executable(${name}_fuzz_seeds ${ARG_SEEDS})
      target_link_libraries(${name}_fuzz_seeds PRIVATE ${ARG_LIBS} pico_warnings)
      file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/${name}_fuzz.seeds "${name}_fuzz_seeds DIR writes the seed corpus\n")
    endif()
  endif()
  if(PICO_BUILD_TESTS AND NOT PICO_FUZZ AND NOT PICO_SANITIZE AND NOT PICO_ENGINE_ONLY AND NOT CMAKE_CROSSCOMPILING)
    add_test(NAME fuzz_${name} COMMAND ${PROJECT_SOURCE_DIR}/scripts/fuzz ${name} ${ARG_SECONDS})
    # One build-fuzz/ for all targets: its build is not run twice at once.
    set_tests_properties(fuzz_${name} PROPERTIES LABELS fuzz TIMEOUT 3600 RESOURCE_LOCK build_fuzz)
  endif()
endfunction()
