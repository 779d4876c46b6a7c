#!/usr/bin/env bash
# The README's test command (`make test`) in a fresh clone of this commit, run
# by an unprivileged user: proves that a clone tests itself without root.
#
# Run it as root (CI does, after `make install` has put the Debian packages in
# place). It creates the system user node-agent-ci when missing, clones the
# commit into a temporary directory owned by that user (nothing beside the
# clone: no sibling directories), and runs `make test` there as that user, with a clean
# environment and HOME in the same temporary directory. The user's `make
# install` finds every Debian package present, so it needs no root. Tests that
# need root (a private libvirtd, switching to nobody, mounting a tmpfs) skip,
# saying why. Exit status: make's.
#
#   tests/run-as-user.sh            # or: make test-as-user
#   NODE_AGENT_CI_USER=someone tests/run-as-user.sh
set -euo pipefail

user="${NODE_AGENT_CI_USER:-node-agent-ci}"
src="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$(id -u)" != 0 ]; then
  echo "run-as-user: run this as root: it creates the user $user and switches to it" >&2
  exit 2
fi
commit="$(git -C "$src" rev-parse HEAD)"
if [ -n "$(git -C "$src" status --porcelain)" ]; then
  echo "run-as-user: uncommitted changes in $src are not tested (clone of $commit)" >&2
fi
if ! id "$user" >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin "$user"
  echo "run-as-user: created the system user $user"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/node-agent-as-user.XXXXXX")"
trap 'rm -rf "$work"' EXIT
git -c advice.detachedHead=false clone -q --no-hardlinks "$src" "$work/node-agent"
git -C "$work/node-agent" -c advice.detachedHead=false checkout -q "$commit"
mkdir "$work/home"
# The package index as root is configured to use it (a local mirror, say),
# so the user installs the same packages from the same place.
for conf in "${PIP_CONFIG_FILE:-}" "${HOME:-/root}/.config/pip/pip.conf" \
            "${HOME:-/root}/.pip/pip.conf"; do
  if [ -n "$conf" ] && [ -f "$conf" ]; then
    mkdir -p "$work/home/.config/pip"
    cp "$conf" "$work/home/.config/pip/pip.conf"
    break
  fi
done
chown -R "$user:$(id -gn "$user")" "$work"

# A clean environment: the user's own HOME and the system PATH (no root's
# pyenv or ~/.local), plus what says where packages come from.
keep=()
while IFS= read -r name; do
  keep+=("$name=${!name}")
done < <(compgen -e | grep -E '^(PIP_[A-Z_]+|SSL_CERT_(FILE|DIR)|REQUESTS_CA_BUNDLE|(https?|no)_proxy|(HTTPS?|NO)_PROXY)$' || true)
# -rs: the log lists each skipped test with its reason (the tests that need root).
# The --ignore'd modules are run by the root pass and by a plain `make test`:
# they compare data with nova's functions or kill, hang and restart processes
# the test itself started, the same for any user, and take about 3.5 minutes
# of a pass (measured at 291de2e): CI stays well under 40 minutes.
same_for_any_user="--ignore=tests/conformance --ignore=tests/integration/test_applier_dead_hosts.py \
--ignore=tests/integration/test_reshape_crash.py --ignore=tests/integration/test_capacity_property.py"
env=(env -i "HOME=$work/home" "USER=$user" "LOGNAME=$user" "LANG=C.UTF-8"
     "PYTEST_ADDOPTS=-rs $same_for_any_user"
     "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "${keep[@]}")
if command -v runuser >/dev/null; then
  as_user=(runuser -u "$user" --)
else
  as_user=(setpriv "--reuid=$user" "--regid=$(id -gn "$user")" --init-groups)
fi

echo "run-as-user: make test as $user in a fresh clone of $commit at $work/node-agent"
started=$(date +%s)
status=0
# TEST_LINT=: lint reads the same commit whoever runs it; .ci/run's root pass
# has linted it (run this script alone after a `make lint`).
(cd "$work/node-agent" && "${as_user[@]}" "${env[@]}" make test TEST_LINT=) || status=$?
echo "run-as-user: make test as $user exited $status after $(( $(date +%s) - started )) s"
exit "$status"
