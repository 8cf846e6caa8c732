# slim_find_nanobind(<missing_var>): find Python (abi3-capable when scikit-build-core asks for the
# stable ABI) and nanobind through `python -m nanobind --cmake_dir`. Sets <missing_var> to "" when
# both are usable, else to what is missing. A macro so nanobind's functions and Python_* reach the
# caller's scope.
macro(slim_find_nanobind missing_var)
  set(${missing_var} "")
  # Development.SABIModule (via SKBUILD_SABI_COMPONENT) lets nanobind build abi3 on Python >= 3.12.
  find_package(Python 3.8 COMPONENTS Interpreter Development.Module ${SKBUILD_SABI_COMPONENT})
  if(NOT Python_FOUND)
    set(${missing_var} "Python development files")
  else()
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
      OUTPUT_VARIABLE _slim_nanobind_dir OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _slim_nanobind_rc ERROR_QUIET)
    if(_slim_nanobind_rc EQUAL 0)
      list(APPEND CMAKE_PREFIX_PATH "${_slim_nanobind_dir}")
    endif()
    find_package(nanobind CONFIG QUIET)
    if(NOT nanobind_FOUND)
      set(${missing_var} "nanobind (pip install nanobind)")
    endif()
  endif()
endmacro()
