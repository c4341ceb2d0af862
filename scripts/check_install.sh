#!/usr/bin/env bash
# A clone with nothing beside it, and the wheel a user installs: the checks of issue 29's item 5.
#
#   scripts/check_install.sh [--tests] [REPO]      (REPO: this repository by default)
#
# 1. Clones REPO's committed HEAD into an empty temporary folder and runs the README's demo command
#    there, verbatim (taken from README.md's "Set-up" section); with --tests, the README's test
#    command too, as .ci/run runs it (derandomized hypothesis).
# 2. Builds the wheel from that clone, installs it in a fresh venv (torch==2.13.0 first, as the
#    README does), and runs `circuits --version` and `circuits demo` from an empty folder, so
#    nothing can come from the repository.
# It takes minutes (two venvs, two torch installs); tests/test_packaging.py checks the wheel's
# contents within the suite.
set -euo pipefail

run_tests=0
if [[ "${1:-}" == "--tests" ]]; then
    run_tests=1
    shift
fi
repo="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
work="$(mktemp -d /tmp/check_install.XXXXXX)"
echo "== working in $work (removed at the end only if every step passes)"

git clone -q "$repo" "$work/clone/repo"
cd "$work/clone/repo"
ls -A "$work/clone" | grep -qvx repo && { echo "the clone has something beside it"; exit 1; }

# the README's set-up commands, verbatim: the bash blocks of its "Set-up" section, in order
mapfile -t commands < <(python3 - <<'EOF'
import re
readme = open("README.md").read()
setup = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
for block in re.findall(r"```bash\n(.*?)\n```", setup, re.S):
    print(block.strip())
EOF
)
[[ ${#commands[@]} -eq 2 ]] || { echo "expected 2 commands in README's Set-up, found ${#commands[@]}"; exit 1; }

echo "== README demo command: ${commands[0]}"
start=$SECONDS
bash -c "${commands[0]}"
echo "== demo command passed in $((SECONDS - start)) s"

if [[ $run_tests -eq 1 ]]; then
    echo "== README test command (CIRCUITS_HYPOTHESIS_PROFILE=ci, as .ci/run): ${commands[1]}"
    start=$SECONDS
    CIRCUITS_HYPOTHESIS_PROFILE=ci bash -c "${commands[1]}"
    echo "== test command passed in $((SECONDS - start)) s"
fi

echo "== the wheel, in a fresh venv, run from an empty folder"
start=$SECONDS
.venv/bin/pip wheel -q --no-deps -w "$work/wheel" .
wheel="$(ls "$work"/wheel/*.whl)"
echo "built $(basename "$wheel")"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.13.0
"$work/venv/bin/pip" install -q "$wheel"
mkdir "$work/elsewhere"
cd "$work/elsewhere"
"$work/venv/bin/python" - <<'EOF'
from importlib import metadata, resources
import circuits
where = circuits.__file__
print("circuits imported from", where)
assert "/site-packages/" in where, where
print("distribution", metadata.version("circuits-interp"), "| py.typed:", resources.files("circuits").joinpath("py.typed").is_file())
EOF
"$work/venv/bin/circuits" --version
"$work/venv/bin/circuits" demo
echo "== wheel check passed in $((SECONDS - start)) s"
rm -rf "$work"
