# GPU backends: each option exists from the start and turns itself off, with a
# message, when its toolchain is not installed. The backend code arrives with the
# backend issues; engine/backend/ holds the interface they implement.
# Vulkan is on by default for native builds (scripts/setup.sh installs libvulkan-dev,
# glslc and Mesa's lavapipe, so its tests run in the plain test run); cross builds of
# the engine leave it out.
if(CMAKE_CROSSCOMPILING)
  option(PICO_VULKAN "Build the Vulkan backend" OFF)
else()
  option(PICO_VULKAN "Build the Vulkan backend" ON)
endif()
option(PICO_CUDA "Build the CUDA backend" OFF)
option(PICO_HIP "Build the HIP backend" OFF)

if(PICO_VULKAN)
  find_package(Vulkan QUIET COMPONENTS glslc)
  if(NOT Vulkan_FOUND OR NOT TARGET Vulkan::glslc)
    message(STATUS "pico: Vulkan SDK or glslc not found, PICO_VULKAN off")
    set(PICO_VULKAN OFF CACHE BOOL "" FORCE)
  endif()
endif()
if(PICO_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(STATUS "pico: nvcc not found, PICO_CUDA off")
    set(PICO_CUDA OFF CACHE BOOL "" FORCE)
  endif()
endif()
if(PICO_HIP)
  include(CheckLanguage)
  check_language(HIP)
  if(NOT CMAKE_HIP_COMPILER)
    message(STATUS "pico: hipcc/ROCm not found, PICO_HIP off")
    set(PICO_HIP OFF CACHE BOOL "" FORCE)
  endif()
endif()
message(STATUS "pico backends: cpu=ON vulkan=${PICO_VULKAN} cuda=${PICO_CUDA} hip=${PICO_HIP}")
