# ATTNKIT_STRICT_WARNINGS: the warning set of a strict user, plus -Werror. attnkit's headers
# are ordinary (non-SYSTEM) includes in a user's build, so they must stay clean under it.
# The header checks (tests/headers) and every package-test consumer (tests/package) compile
# with it; attnkit's other targets keep -Wall -Wextra -Wpedantic (attnkitTargets.cmake).
# Every flag is accepted by GCC 12 and Clang 14; the GCC-only ones sit behind a generator
# expression, so the list can be handed as is to a project built with either compiler.
# Not in the set: -Wfloat-equal (exact compares with -inf and 0 are intended) and Clang's
# -Wweak-vtables (a header-only library has no translation unit to anchor a vtable in).
set(ATTNKIT_STRICT_WARNINGS
  -Wall -Wextra -Wpedantic
  -Wconversion -Wsign-conversion -Wdouble-promotion
  -Wshadow -Wold-style-cast -Wcast-qual -Wcast-align -Wzero-as-null-pointer-constant
  -Wnon-virtual-dtor -Woverloaded-virtual -Wnull-dereference
  -Wformat=2 -Wundef -Wimplicit-fallthrough -Wextra-semi -Wmissing-declarations
  $<$<CXX_COMPILER_ID:GNU>:-Wuseless-cast>
  $<$<CXX_COMPILER_ID:GNU>:-Wlogical-op>
  $<$<CXX_COMPILER_ID:GNU>:-Wduplicated-cond>
  -Werror)
