# Warnings on for every pico target (gcc 12 and clang 14 both build clean).
add_library(pico_warnings INTERFACE)
target_compile_options(pico_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
  -Wnon-virtual-dtor -Woverloaded-virtual -Wimplicit-fallthrough
  $<$<CXX_COMPILER_ID:GNU>:-Wno-stringop-overflow>)
if(PICO_WERROR)
  target_compile_options(pico_warnings INTERFACE -Werror)
endif()
