# Small helpers shared by the subdirectories.

# Adds every immediate subdirectory of the current source directory that has a CMakeLists.txt.
# Targets may refer to each other regardless of order (CMake resolves them at generate time).
macro(tandem_add_subdirectories)
  file(GLOB _tandem_children RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} CONFIGURE_DEPENDS
       ${CMAKE_CURRENT_SOURCE_DIR}/*/CMakeLists.txt)
  list(SORT _tandem_children)
  foreach(_child ${_tandem_children})
    get_filename_component(_dir ${_child} DIRECTORY)
    add_subdirectory(${_dir})
  endforeach()
endmacro()

# tandem_add_test(NAME n SOURCES a.cc ... LIBS lib ... [LABELS l ...])
# One GoogleTest executable; each test case becomes a ctest test.
function(tandem_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${T_NAME} PRIVATE
    TANDEM_SOURCE_DIR="${CMAKE_SOURCE_DIR}" TANDEM_BINARY_DIR="${CMAKE_BINARY_DIR}")
  set(_labels ${T_LABELS})
  if(NOT _labels)
    set(_labels cpu)
  endif()
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT 900 LABELS "${_labels}")
endfunction()
