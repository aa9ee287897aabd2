# A lean llama-cpp-python build: what `python -m llama_cpp.server` loads, nothing else.
#
# The README's commands pass this file to llama-cpp-python's CMake build:
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/cmake/llama_lean.cmake"
# CMake includes it right after llama.cpp's project() call, before its options are declared.
#
# llama-cpp-python's own CMakeLists forces LLAMA_BUILD_COMMON ON in the cache (FORCE, so a plain
# -DLLAMA_BUILD_COMMON=OFF is overwritten). llama.cpp's common library (chat parsers, argument
# parsing, downloads, with cpp-httplib) is then compiled and copied into site-packages/lib as
# libllama-common.so, but the Python package never loads it: llama_cpp loads libllama and
# libggml*, and libmtmd (built only with LLAVA_BUILD, for the multimodal chat handlers) must not
# link it. A normal variable set here shadows the cache entry in llama.cpp's directory, and
# option() leaves it alone (policy CMP0077, NEW under llama.cpp's cmake_minimum_required), so
# common/ and cpp-httplib are never added. Tests, examples, tools and the server binary are off
# already: llama.cpp builds them only as a top-level project.
set(LLAMA_BUILD_COMMON OFF)
