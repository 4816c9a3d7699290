// The library version, kept equal to the CMake project version.
#pragma once

#define ATTNKIT_VERSION_MAJOR 0
#define ATTNKIT_VERSION_MINOR 1
#define ATTNKIT_VERSION_PATCH 0
