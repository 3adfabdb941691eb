# The CUDA backend (APIARY_CUDA = AUTO | ON | OFF).
#   AUTO: built when nvcc and the CUDA toolkit are found (CI builds and links
#         it there although nothing runs it, so a change that breaks the GPU
#         build fails CI);
#   ON:   required: configuring fails, saying what is missing;
#   OFF:  the CPU-only build, exactly as without this file.
# Sets APIARY_HAVE_CUDA and APIARY_HAVE_NCCL; enables the CUDA language.
# Code is built for sm_90 (H100/H200) plus compute_90 PTX that the driver
# compiles for newer chips (APIARY_CUDA_ARCHS overrides).
set(APIARY_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when the toolkit is found), ON, OFF")
set_property(CACHE APIARY_CUDA PROPERTY STRINGS AUTO ON OFF)
set(APIARY_CUDA_ARCHS "90-real;90-virtual" CACHE STRING "CMAKE_CUDA_ARCHITECTURES of the CUDA backend")
set(APIARY_NCCL_ROOT "" CACHE PATH "Folder holding include/nccl.h and lib/libnccl.so (default: the CUDA toolkit's)")
set(APIARY_HAVE_CUDA OFF)
set(APIARY_HAVE_NCCL OFF)

string(TOUPPER "${APIARY_CUDA}" _apiary_cuda)
if(NOT _apiary_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "APIARY_CUDA = '${APIARY_CUDA}': expected AUTO, ON or OFF")
endif()

if(NOT _apiary_cuda STREQUAL "OFF")
  # nvcc by name (CMAKE_CUDA_COMPILER, CUDACXX, PATH, /usr/local/cuda) rather
  # than check_language(CUDA), which test-compiles a whole project first:
  # enable_language below does that once, and a CPU-only machine pays nothing.
  if(NOT CMAKE_CUDA_COMPILER)
    if(DEFINED ENV{CUDACXX})
      set(CMAKE_CUDA_COMPILER "$ENV{CUDACXX}")
    else()
      find_program(APIARY_NVCC nvcc PATHS /usr/local/cuda/bin)
      if(APIARY_NVCC)
        set(CMAKE_CUDA_COMPILER "${APIARY_NVCC}")
      endif()
    endif()
  endif()
  set(_apiary_cuda_missing "")
  if(NOT CMAKE_CUDA_COMPILER OR NOT EXISTS "${CMAKE_CUDA_COMPILER}")
    set(_apiary_cuda_missing "the CUDA compiler nvcc (set CMAKE_CUDA_COMPILER or put nvcc on PATH)")
  else()
    get_filename_component(_apiary_nvcc_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT})
      get_filename_component(CUDAToolkit_ROOT "${_apiary_nvcc_bin}" DIRECTORY)
    endif()
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND)
      set(_apiary_cuda_missing "the CUDA toolkit (FindCUDAToolkit found none; set CUDAToolkit_ROOT)")
    elseif(NOT TARGET CUDA::cublasLt)
      set(_apiary_cuda_missing "cuBLASLt (libcublasLt) in the CUDA toolkit at ${CUDAToolkit_LIBRARY_DIR}")
    endif()
  endif()
  if(_apiary_cuda_missing STREQUAL "")
    set(APIARY_HAVE_CUDA ON)
  elseif(_apiary_cuda STREQUAL "ON")
    message(FATAL_ERROR "APIARY_CUDA=ON but ${_apiary_cuda_missing} is missing; "
                        "install it or configure with -DAPIARY_CUDA=OFF (or AUTO)")
  else()
    message(STATUS "CUDA backend: off (APIARY_CUDA=AUTO and ${_apiary_cuda_missing} is missing)")
  endif()
endif()

if(APIARY_HAVE_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "${APIARY_CUDA_ARCHS}")
  endif()
  # C++17: CMake 3.25 (Debian 12) knows no C++20 flag for nvcc; the .cu files need none.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  set(CMAKE_CUDA_FLAGS_RELEASE "-O3 -DNDEBUG")
  # NCCL: the toolkit's copy, APIARY_NCCL_ROOT, or pip's nvidia-nccl wheel
  # (its library is named libnccl.so.2 only).
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${APIARY_NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${APIARY_NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(APIARY_HAVE_NCCL ON)
    add_library(apiary_nccl INTERFACE)
    target_include_directories(apiary_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(apiary_nccl INTERFACE ${NCCL_LIBRARY})
  endif()
  message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs "
                 "${CMAKE_CUDA_ARCHITECTURES}; NCCL: ${APIARY_HAVE_NCCL} ${NCCL_LIBRARY})")
endif()
