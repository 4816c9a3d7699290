# ATTNKIT_REPORT_PYTHON: the Python 3 that runs scripts/bench_report.py. Where the first
# python3 on PATH (a pyenv or venv one, say) cannot import matplotlib but the system's
# /usr/bin/python3 can (Debian's python3-matplotlib, see scripts/install-deps.sh), the
# system one, so the report gets its plots; otherwise the first one, and the report prints
# the table and says how to get plots. Empty when there is no Python 3.
include_guard(GLOBAL)

find_package(Python3 COMPONENTS Interpreter)
set(ATTNKIT_REPORT_PYTHON "")
foreach(candidate IN ITEMS "${Python3_EXECUTABLE}" /usr/bin/python3)
  if(candidate AND EXISTS "${candidate}")
    if(NOT ATTNKIT_REPORT_PYTHON)
      set(ATTNKIT_REPORT_PYTHON "${candidate}")
    endif()
    execute_process(COMMAND "${candidate}" -c "import matplotlib" RESULT_VARIABLE no_mpl
                    OUTPUT_QUIET ERROR_QUIET)
    if(no_mpl EQUAL 0)
      set(ATTNKIT_REPORT_PYTHON "${candidate}")
      break()
    endif()
  endif()
endforeach()
if(NOT ATTNKIT_REPORT_PYTHON)
  message(STATUS "attnkit: no Python 3 found; the bench report and its test are not registered")
endif()
