# format_sources.sh (sourced): format_sources prints, NUL-separated, the sources that
# scripts/format.sh formats and scripts/check_format.sh checks.
format_sources() {
  git ls-files -z --cached -- \
    'src/*.h' 'src/*.hpp' 'src/*.cpp' 'src/*.cc' 'src/*.cu' 'src/*.cuh' \
    'tests/*.h' 'tests/*.hpp' 'tests/*.cpp' 'tests/*.cc' 'tests/*.cu' 'tests/*.cuh' \
    'bench/*.h' 'bench/*.hpp' 'bench/*.cpp' 'bench/*.cc' 'bench/*.cu' 'bench/*.cuh' \
    'tools/*.h' 'tools/*.hpp' 'tools/*.cpp' 'tools/*.cc' 'tools/*.cu' 'tools/*.cuh' \
    ':(exclude)tests/fixtures/*' ':(exclude)*/node_modules/*'
}
