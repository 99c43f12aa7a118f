#!/usr/bin/env bash
# Gives every tracked file of a clean checkout the modification time at which the build cache
# first saw its content, so that a fresh clone rebuilds only what changed.
#
# Cargo decides whether a workspace crate is fresh by modification times: a unit is rebuilt when
# one of its source files is newer than the unit's last build. A fresh clone writes every file
# now, so a warm target directory rebuilt all five crates (837 s of a 1,601 s warm run at 890fcf1)
# though their sources were the ones already built. Cargo's content-hash freshness
# (`-Zchecksum-freshness`) is unstable, so this script does it for cargo: it keeps a list, in the
# target directory, of each tracked file's blob hash and the time at which that content was first
# seen there.
#   - A file whose content is in the list gets that time. Every build since then saw this content
#     (the list changes the moment the content does, before anything is built), so a unit built
#     after it is fresh and a unit built before it is stale, as it should be.
#   - A file that is new or changed gets the time now, and so is newer than every earlier build.
# The list is written, atomically, before the build starts, so a build that fails part way still
# leaves a list that says what it built from. A checkout with uncommitted changes is left as it
# is and the list removed, since what gets built there is not what git says; the next clean run
# then treats every file as new. scripts/ci/source-times-test.sh checks each of these cases.
# The target directory must be CI's own: a build into it from another checkout, which does not
# go through this script, leaves units that the list does not describe.
#
# Usage: bash scripts/ci/source-times.sh   (from the checkout; uses $CARGO_TARGET_DIR like cargo)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
target="${CARGO_TARGET_DIR:-target}"
list="$target/haares-ci-source-times.tsv"
mkdir -p "$target"

if [ -n "$(git status --porcelain --untracked-files=normal)" ]; then
    rm -f "$list"
    echo "source times: the checkout has uncommitted changes; modification times left as they are"
    exit 0
fi

now="$(date +%s.%N)"
next="$(mktemp "$list.XXXXXX")"
trap 'rm -f "$next"' EXIT
# Lines of the list: blob hash, seconds since the epoch, path (tab-separated). Paths as they are
# (no octal quoting of non-ASCII names, which `touch` would not find); git still quotes a path
# with a tab or newline in it, and `touch` then fails the run rather than skip the file.
git -c core.quotePath=false ls-files --stage | awk -F '\t' -v now="$now" -v list="$list" '
    BEGIN {
        while ((getline line < list) > 0) {
            split(line, field, "\t")
            seen[field[3]] = field[1] "\t" field[2]
        }
    }
    {
        split($1, meta, " ")
        if (meta[1] == "160000") next  # a submodule: not a file of this checkout
        blob = meta[2]; path = $2
        time = now
        if (path in seen) {
            split(seen[path], old, "\t")
            if (old[1] == blob) time = old[2]
        }
        print blob "\t" time "\t" path
    }' > "$next"
mv "$next" "$list"

kept=0
changed=0
while IFS=$'\t' read -r _ time path; do
    # -h: a symbolic link gets the time itself, not the file it points to.
    touch -h -d "@$time" -- "$path"
    if [ "$time" = "$now" ]; then changed=$((changed + 1)); else kept=$((kept + 1)); fi
done < "$list"
echo "source times: $kept files as the build cache saw them, $changed new or changed"
