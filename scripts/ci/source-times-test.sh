#!/usr/bin/env bash
# Checks scripts/ci/source-times.sh on a one-file crate built in fresh clones that share a target
# directory, as CI's clones do: a clone of content already built is fresh, and every clone whose
# content differs from the last build (changed, changed back, or after a build of uncommitted
# changes) is rebuilt and runs its own code. A stale build here would be a CI run that tests
# code other than the commit's, so each case checks the printed value, not only the build log.
#
# Usage: bash scripts/ci/source-times-test.sh   (1.4 s on the 2-core machine; needs git and cargo)
set -euo pipefail
script="$(cd "$(dirname "$0")" && pwd)/source-times.sh"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export CARGO_TARGET_DIR="$scratch/target"
export GIT_AUTHOR_NAME=ci GIT_AUTHOR_EMAIL=ci@localhost
export GIT_COMMITTER_NAME=ci GIT_COMMITTER_EMAIL=ci@localhost

origin="$scratch/origin"
mkdir -p "$origin/src"
git -C "$origin" init -q
printf '[package]\nname = "probe"\nversion = "0.1.0"\nedition = "2021"\n' > "$origin/Cargo.toml"
printf '/target\n' > "$origin/.gitignore"
commit_value() {  # commit_value VALUE: the origin's program prints VALUE
    printf 'fn main() { println!("%s"); }\n' "$1" > "$origin/src/main.rs"
    git -C "$origin" add -A
    git -C "$origin" commit -q -m "prints $1"
}
fresh_clone() {  # prints the path of a new clone of the origin
    local clone
    clone="$(mktemp -d "$scratch/clone.XXXXXX")"
    git clone -q "$origin" "$clone"
    echo "$clone"
}
fail() { echo "source-times test: $*" >&2; exit 1; }
# check CLONE EXPECTED_VALUE compiles|fresh: builds and runs the clone after the script.
check() {
    local clone="$1" expected="$2" build="$3" log value
    (cd "$clone" && bash "$script" >/dev/null)
    log="$(cd "$clone" && cargo build --offline 2>&1)"
    value="$(cd "$clone" && cargo run --offline --quiet)"
    [ "$value" = "$expected" ] || fail "$clone printed '$value', its source says '$expected'"
    if [ "$build" = compiles ]; then
        grep -q 'Compiling probe' <<< "$log" || fail "$clone was not rebuilt:"$'\n'"$log"
    else
        if grep -q 'Compiling probe' <<< "$log"; then fail "$clone was rebuilt, its content was built"; fi
    fi
}

commit_value 1
check "$(fresh_clone)" 1 compiles            # the first build
check "$(fresh_clone)" 1 fresh               # the same content in a new clone: nothing to build
commit_value 2
check "$(fresh_clone)" 2 compiles            # changed
commit_value 1
check "$(fresh_clone)" 1 compiles            # changed back to content built two clones ago
check "$(fresh_clone)" 1 fresh

dirty="$(fresh_clone)"
printf 'fn main() { println!("uncommitted"); }\n' > "$dirty/src/main.rs"
(cd "$dirty" && bash "$script" | grep -q 'uncommitted changes') || fail "a dirty checkout was not recognised"
[ ! -e "$CARGO_TARGET_DIR/haares-ci-source-times.tsv" ] || fail "a dirty checkout kept the list"
value="$(cd "$dirty" && cargo run --offline --quiet 2>/dev/null)"
[ "$value" = uncommitted ] || fail "the dirty checkout printed '$value'"
check "$(fresh_clone)" 1 compiles            # clean again, after a build of other content
check "$(fresh_clone)" 1 fresh
echo "source-times test: $(find "$scratch" -maxdepth 1 -name "clone.*" | wc -l) clones, each built from its own content, unchanged ones kept"
