# Debian 12's xsimd 8.1 package exports a target whose INTERFACE_LINK_LIBRARIES names a
# plain `xtl` that its config never finds, so every link line gets `-lxtl` and fails.
# attnkit uses no xtl feature of xsimd: when no xtl target exists, an empty one stands in.
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_attnkit_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
  if(_attnkit_xsimd_links MATCHES "(^|;)xtl(;|$)")
    add_library(xtl INTERFACE IMPORTED)
  endif()
  unset(_attnkit_xsimd_links)
endif()
