# tests/fuzz/fuzz.cmake — libFuzzer targets for the parsers (included by CMakeLists.txt).
#
# The targets are built with clang (-fsanitize=fuzzer,address,undefined) whatever compiles the rest:
# each links its parser's sources, compiled with coverage and sanitizers, ahead of the ordinary
# libtessera.a (the linker then takes those symbols from the instrumented copies). Built when clang
# can link libFuzzer (Debian: clang libclang-rt-dev; `TS_WITH_FUZZ=1 scripts/install-deps`) and the
# build is not a gcc sanitizer build (two ASan runtimes cannot be mixed); otherwise the ctest entries
# exit 77 (skipped). ctest runs each for a fixed number of inputs (seconds); bench/fuzz.sh runs long.
#
#   fuzz_ckpt   src/io/ckpt.c                 checkpoint files (ts__ckpt_load_mem)
#   fuzz_idx    src/data/idx.c                IDX files, plain and gzip (ts__idx_read_fd on a memfd)
#   fuzz_image  src/pipeline/decode.c, ops.c  JPEG/PNG: whole, scaled, window and chosen-window decodes
#   fuzz_store  src/distributed/store_tcp.c   the TCP store server's request parsing, over loopback
#   fuzz_safetensors  src/io/safetensors.c    safetensors files (ts__safetensors_load_mem)
#   fuzz_json   src/core/json.c               the JSON reader: a full walk against ts__json_skip
#   fuzz_tokens src/data/tokens.c, tokenizer.c token shards, GPT-2 vocab.json/merges.txt, encode/decode
set(TS_FUZZ_DIR ${CMAKE_BINARY_DIR}/fuzz)
set(TS_FUZZ_TARGETS ckpt idx image store safetensors json tokens)
set(TS_FUZZ_SRC_ckpt src/io/ckpt.c src/core/file.c)
set(TS_FUZZ_SRC_idx src/data/idx.c src/core/file.c)
set(TS_FUZZ_SRC_image src/pipeline/decode.c src/pipeline/ops.c src/core/file.c)
set(TS_FUZZ_SRC_store src/distributed/store_tcp.c src/distributed/store.c src/distributed/sock.c)
set(TS_FUZZ_SRC_safetensors src/io/safetensors.c src/core/json.c src/core/file.c)
set(TS_FUZZ_SRC_json src/core/json.c)
set(TS_FUZZ_SRC_tokens src/data/tokens.c src/data/tokenizer.c src/core/json.c src/core/file.c)
set(TS_FUZZ_RUNS_ckpt 200000)
set(TS_FUZZ_RUNS_idx 50000)
set(TS_FUZZ_RUNS_image 100000)
set(TS_FUZZ_RUNS_store 5000)
set(TS_FUZZ_RUNS_safetensors 100000)
set(TS_FUZZ_RUNS_json 200000)
set(TS_FUZZ_RUNS_tokens 20000)

find_program(TS_CLANG NAMES clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14)
set(TS_FUZZ_OK FALSE)
if(TS_CLANG AND NOT TS_SANITIZE)
  file(WRITE ${TS_FUZZ_DIR}/check.c
    "#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\n"
    "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
  execute_process(COMMAND ${TS_CLANG} -fsanitize=fuzzer,address,undefined ${TS_FUZZ_DIR}/check.c -o ${TS_FUZZ_DIR}/check
    RESULT_VARIABLE TS_FUZZ_RC OUTPUT_QUIET ERROR_QUIET)
  if(TS_FUZZ_RC EQUAL 0)
    set(TS_FUZZ_OK TRUE)
  endif()
endif()
if(TS_FUZZ_OK)
  ts_report("libFuzzer targets (${TS_CLANG})" TRUE)
elseif(TS_SANITIZE)
  ts_report("libFuzzer targets (built in the non-sanitizer build)" FALSE)
else()
  ts_report("libFuzzer targets (no clang with libFuzzer: apt-get install clang libclang-rt-dev)" FALSE)
endif()

if(TS_FUZZ_OK)
  set(TS_FUZZ_INCLUDES ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src ${CBLAS_INCLUDE}
    ${TURBOJPEG_INCLUDE_DIRS} ${SPNG_INCLUDE_DIRS} ${JPEG_INCLUDE_DIRS})
  set(TS_FUZZ_CFLAGS -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  foreach(dir ${TS_FUZZ_INCLUDES})
    list(APPEND TS_FUZZ_CFLAGS -I${dir})
  endforeach()
  set(TS_FUZZ_LIBS ${OPENBLAS_LIB} ${ZLIB_LIBRARIES} ${OPENSSL_CRYPTO_LIBRARY} ${TURBOJPEG_LINK_LIBRARIES} ${SPNG_LINK_LIBRARIES}
    ${JPEG_LIBRARIES} ${OpenMP_C_LIBRARIES})
  if(TS_WITH_MPI)
    list(APPEND TS_FUZZ_LIBS ${MPI_C_LIBRARIES})
  endif()
  if(TS_WITH_DNNL)
    list(APPEND TS_FUZZ_LIBS ${DNNL_LIB})
  endif()
  if(TS_WITH_CUDA)
    list(APPEND TS_FUZZ_LIBS ${TS_CUDA_LIBS} -lstdc++)
  endif()
  list(APPEND TS_FUZZ_LIBS -lpthread -lm)
  file(GLOB_RECURSE TS_FUZZ_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/*.h ${PROJECT_SOURCE_DIR}/include/*.h)
  set(TS_FUZZ_BINS "")
  foreach(t ${TS_FUZZ_TARGETS})
    set(srcs ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_${t}.c)
    foreach(s ${TS_FUZZ_SRC_${t}})
      list(APPEND srcs ${PROJECT_SOURCE_DIR}/${s})
    endforeach()
    add_custom_command(OUTPUT ${TS_FUZZ_DIR}/fuzz_${t}
      COMMAND ${TS_CLANG} ${TS_FUZZ_CFLAGS} ${srcs} -Wl,--as-needed $<TARGET_FILE:tessera_static> ${TS_FUZZ_LIBS}
        -o ${TS_FUZZ_DIR}/fuzz_${t}
      DEPENDS ${srcs} ${TS_FUZZ_HEADERS} tessera_static
      COMMENT "Building libFuzzer target fuzz/fuzz_${t} with ${TS_CLANG}" VERBATIM)
    list(APPEND TS_FUZZ_BINS ${TS_FUZZ_DIR}/fuzz_${t})
  endforeach()
  add_custom_target(fuzz ALL DEPENDS ${TS_FUZZ_BINS})
endif()
# The seed generator (a plain program): build/fuzz_make_seeds tests/fuzz/corpus
add_executable(fuzz_make_seeds EXCLUDE_FROM_ALL ${PROJECT_SOURCE_DIR}/tests/fuzz/make_seeds.c)
target_link_libraries(fuzz_make_seeds PRIVATE tessera_static PkgConfig::TURBOJPEG PkgConfig::SPNG ZLIB::ZLIB OpenSSL::Crypto)

foreach(t ${TS_FUZZ_TARGETS})
  add_test(NAME fuzz_${t} COMMAND bash ${PROJECT_SOURCE_DIR}/tests/fuzz/run.sh ${TS_FUZZ_DIR}/fuzz_${t}
    ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/${t} ${TS_FUZZ_RUNS_${t}} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(fuzz_${t} PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endforeach()
