# The command line of the nested-build scripts (tests/aarch64/run_aarch64.sh,
# tests/fuzz/run_fuzz.sh), sourced by both: every argument is --name=value and sets the shell
# variable `name` (dashes as underscores); an unknown name or a missing required one exits 2.
#
#   parse_args <script> <name...> -- "$@"   the names the script takes, then its arguments
#   require_args <script> <name...>        those that may not be empty

parse_args() {
  local script=$1 names=" " arg name
  shift
  while [ "$1" != "--" ]; do names+="$1 " && shift; done
  shift
  for arg in "$@"; do
    name=${arg%%=*} && name=${name#--} && name=${name//-/_}
    if [[ "$arg" != --*=* || "$names" != *" $name "* ]]; then
      echo "$script: unknown argument '$arg'" >&2
      exit 2
    fi
    printf -v "$name" '%s' "${arg#*=}"
  done
}

require_args() {
  local script=$1 name
  shift
  for name in "$@"; do
    if [ -z "${!name}" ]; then echo "$script: --$name=... is required" >&2 && exit 2; fi
  done
}
