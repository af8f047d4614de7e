# ctest script: fails if an ISA object of src/kernels (compiled with AVX flags) defines a global
# symbol other than its KernelTable (or, kernels_avx512_attention.cc, the one strong function
# kernel_table.h declares for the avx512 table: Avx512AttendPages). A weak copy of an inline
# function or template there could be kept by the linker for the whole binary and run AVX code
# on a CPU without it (src/kernels/kernel_table.h). Arguments: -DNM=nm -DOBJECTS=a.o|b.o
string(REPLACE "|" ";" objects "${OBJECTS}")
set(bad "")
foreach(obj IN LISTS objects)
  execute_process(COMMAND ${NM} -C --defined-only ${obj} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${obj}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  set(tables 0)
  foreach(line IN LISTS lines)
    # Global (upper case), unique global (u) or indirect (i) definitions.
    if(line MATCHES "^[0-9a-fA-F]* ([A-TV-Zui]) (.*)$")
      set(type "${CMAKE_MATCH_1}")
      set(name "${CMAKE_MATCH_2}")
      if(name MATCHES "^pdserve::kernels::internal::k[A-Za-z0-9]+Kernels$")
        math(EXPR tables "${tables} + 1")
      elseif(type STREQUAL "T"
             AND name MATCHES "^pdserve::kernels::internal::Avx512AttendPages\\(")
        # A strong definition, the only one in the binary: no weak copy the linker could pick.
        math(EXPR tables "${tables} + 1")
      elseif(name MATCHES "^(DW\\.ref\\.__gxx_personality_v0|__odr_asan\\..*)$")
        # Compiler-made data, no code: the personality routine's address (Debug builds) and
        # ASan's one-definition-rule markers (sanitizer builds).
      else()
        string(APPEND bad "  ${obj}: ${type} ${name}\n")
      endif()
    endif()
  endforeach()
  if(NOT tables EQUAL 1)
    string(APPEND bad "  ${obj}: expected exactly one KernelTable, found ${tables}\n")
  endif()
  message(STATUS "${obj}: ${tables} kernel table, no other global symbols")
endforeach()
if(NOT bad STREQUAL "")
  message(FATAL_ERROR "ISA objects define global symbols that other files may share:\n${bad}")
endif()
