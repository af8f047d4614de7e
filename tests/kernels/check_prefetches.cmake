# ctest script: fails if the page-attention functions (AttendPagesOf<T>) of the avx2 or avx512
# attention kernel object have lost their software prefetches, or the avx512 product tiles
# (TilePacked<G, T>::Run) their L2 prefetches of the next weight block (prefetcht1). GCC once
# deleted every call of a helper that only prefetched (it was treated as a function without
# effects), silently: no value changes, only the speed of attention at long context (~70 -> ~48
# ms a step on the avx2 path once restored).
# Arguments: -DOBJDUMP=objdump -DOBJECTS=a.o|b.o (objects not named kernels_avx* are ignored).
string(REPLACE "|" ";" objects "${OBJECTS}")
set(checked 0)
foreach(obj IN LISTS objects)
  if(NOT obj MATCHES "kernels_avx(2|512|512_attention)\\.cc\\.o$")
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
  set(tiles 0)
  foreach(block IN LISTS blocks)
    string(REGEX MATCH "^[0-9a-f]+ <[^\n]*>:" head "${block}")
    if(head MATCHES "AttendPagesOf<")
      math(EXPR functions "${functions} + 1")
      if(NOT block MATCHES "\tprefetcht[012] ")
        message(FATAL_ERROR "${obj}: ${head} has no prefetch instruction left (a prefetch-only "
                            "helper optimised away?)")
      endif()
    elseif(obj MATCHES "avx512\\.cc" AND head MATCHES "TilePacked<[^\n]*>::Run")
      math(EXPR tiles "${tiles} + 1")
      if(NOT block MATCHES "\tprefetcht1 ")
        message(FATAL_ERROR "${obj}: ${head} has no prefetcht1 (the next block's share) left")
      endif()
    endif()
  endforeach()
  if(NOT obj MATCHES "avx512\\.cc" AND functions EQUAL 0)
    message(FATAL_ERROR "${obj}: no AttendPagesOf function found")
  endif()
  if(obj MATCHES "avx512\\.cc" AND tiles EQUAL 0)
    message(FATAL_ERROR "${obj}: no TilePacked<G, T>::Run function found")
  endif()
  message(STATUS "${obj}: ${functions} AttendPagesOf functions, each with prefetches; "
                 "${tiles} product tiles, each with prefetcht1")
  math(EXPR checked "${checked} + 1")
endforeach()
if(NOT checked EQUAL 3)
  message(FATAL_ERROR "expected the avx2, avx512 and avx512 attention kernel objects, found "
                      "${checked}")
endif()
