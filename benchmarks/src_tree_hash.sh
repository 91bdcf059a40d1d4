#!/usr/bin/env bash
# One hash of the source that a GPU run executes (the packages' and the runtime's src folders and the benchmarks'
# Python files, by path and content), printed by gpu_session.sh into each run's env.txt: the device copy's .git is
# stale, so its HEAD does not name the tree. To match a run to a commit REV, hash a clean checkout of it:
#   git worktree add /tmp/rev REV && (cd /tmp/rev && bash benchmarks/src_tree_hash.sh); git worktree remove /tmp/rev
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
find packages/*/src runtime/src benchmarks -name '*.py' -type f -print0 | LC_ALL=C sort -z | xargs -0 sha1sum \
  | sha1sum | cut -c1-12
