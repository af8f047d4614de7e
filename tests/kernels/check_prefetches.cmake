# ctest script: fails if the page-attention functions (AttendPagesOf<T>) of the avx2 or avx512 kernel
# object have lost their software prefetches. GCC once deleted every call of a helper that only
# prefetched (it was treated as a function without effects), silently: no value changes, only
# the speed of attention at long context (~70 -> ~48 ms a step on the avx2 path once restored).
# Arguments: -DOBJDUMP=objdump -DOBJECTS=a.o|b.o (objects not named kernels_avx* are ignored).
string(REPLACE "|" ";" objects "${OBJECTS}")
set(checked 0)
foreach(obj IN LISTS objects)
  if(NOT obj MATCHES "kernels_avx(2|512)\\.cc\\.o$")
    continue()
  endif()
  execute_process(COMMAND ${OBJDUMP} -d -C --no-show-raw-insn ${obj} OUTPUT_VARIABLE out
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${OBJDUMP} failed on ${obj}")
  endif()
  # objdump separates functions by an empty line; each block starts "ADDR <name>:".
  string(REPLACE ";" "," out "${out}")
  string(REPLACE "\n\n" ";" blocks "${out}")
  set(functions 0)
  foreach(block IN LISTS blocks)
    if(block MATCHES "^[0-9a-f]+ <[^\n]*AttendPagesOf<[^\n]*>:")
      math(EXPR functions "${functions} + 1")
      if(NOT block MATCHES "\tprefetcht[012] ")
        string(REGEX MATCH "<[^\n]*>" name "${block}")
        message(FATAL_ERROR "${obj}: ${name} has no prefetch instruction left (a prefetch-only "
                            "helper optimised away?)")
      endif()
    endif()
  endforeach()
  if(functions EQUAL 0)
    message(FATAL_ERROR "${obj}: no AttendPagesOf function found")
  endif()
  message(STATUS "${obj}: ${functions} AttendPagesOf functions, each with prefetches")
  math(EXPR checked "${checked} + 1")
endforeach()
if(NOT checked EQUAL 2)
  message(FATAL_ERROR "expected the avx2 and avx512 kernel objects, found ${checked}")
endif()
