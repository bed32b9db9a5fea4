#!/usr/bin/env bash
# The operator's stack (docs/operations.md), run by scripts/test.sh after the workspace tests
# (whose debug `carteiro` binary it packages):
# - `promtool check rules` and `promtool test rules` on deploy/prometheus;
# - the Debian package (scripts/package.sh --profile dev) installed with `dpkg -i`, then
#   `carteiro --version`, `carteiro check` on the example config as the package's user, the
#   completions and man pages in place, and `systemd-analyze verify` on the installed units.
# Each checker is also fed one violating input and must fail on it. Installing needs root
# (CI runs as root); elsewhere that part is skipped with a line saying so.
# Ends with `ops: N passed, M failed`.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
passed=0 failed=0
check() {
  local what="$1"; shift
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1)); echo "ok: $what"
  else
    failed=$((failed + 1)); echo "FAILED: $what"; sed 's/^/    /' "$log"
  fi
}
# The same, for a command that must fail (a checker fed a violating input).
refuses() {
  local what="$1"; shift
  if "$@" >"$log" 2>&1; then
    failed=$((failed + 1)); echo "FAILED: $what (the check passed a violating input)"
  else
    passed=$((passed + 1)); echo "ok: $what"
  fi
}
# systemd-analyze verify exits 0 on a setting it ignores ("Failed to parse ..."): any line it
# prints is a failure. Documentation=man: links are checked where `man` exists.
verify_units() {
  local man=yes out
  command -v man >/dev/null || man=no
  out="$(systemd-analyze verify --man="$man" "$@" 2>&1)" || { echo "$out"; return 1; }
  [[ -z "$out" ]] || { echo "$out"; return 1; }
}
log="$(mktemp)"
scratch="$(mktemp -d)"
trap 'rm -rf "$log" "$scratch"' EXIT

rules=deploy/prometheus
check "promtool check rules" promtool check rules "$rules/carteiro-rules.yml"
check "promtool test rules" bash -c "cd $rules && promtool test rules carteiro-rules.test.yml"
# 99 dead letters must not fire: with the threshold at 99 the unit tests fail.
cp "$rules"/* "$scratch/"
sed -i 's/increase1h >= 100/increase1h >= 99/' "$scratch/carteiro-rules.yml"
refuses "promtool test rules fails on a lowered threshold" \
  bash -c "cd $scratch && promtool test rules carteiro-rules.test.yml"

if [[ $(id -u) -ne 0 ]]; then
  echo "skipped: the Debian package's install (dpkg -i needs root; CI runs as root)"
else
  deb="$(scripts/package.sh --profile dev 2>"$log" | tail -n 1)"
  check "scripts/package.sh built $deb" test -f "$deb"
  # --force-confnew: a machine that installed an older package takes the new example config
  # without asking (CI has no one to answer).
  check "dpkg -i" env DEBIAN_FRONTEND=noninteractive dpkg -i --force-confnew "$deb" </dev/null
  check "carteiro --version" bash -c 'carteiro --version | grep -qx "carteiro [0-9.]*"'
  check "carteiro check on the example config, as user carteiro" \
    runuser -u carteiro -- env CARTEIRO_AMQP_URL="${CARTEIRO_TEST_AMQP_URL:?}" \
    carteiro check -c /etc/carteiro/carteiro.toml
  check "completions for bash, zsh and fish" test -s /usr/share/bash-completion/completions/carteiro \
    -a -s /usr/share/zsh/vendor-completions/_carteiro -a -s /usr/share/fish/vendor_completions.d/carteiro.fish
  check "man pages" bash -c 'zcat /usr/share/man/man1/carteiro-dlq-replay.1.gz | grep -q "carteiro dlq replay"'
  if command -v systemd-analyze >/dev/null; then
    units=(/lib/systemd/system/carteiro.service /lib/systemd/system/carteiro-relay.service)
    check "systemd-analyze verify (installed units)" verify_units "${units[@]}"
    sed 's/^ProtectSystem=strict/ProtectSystem=sometimes/' "${units[0]}" >"$scratch/carteiro.service"
    refuses "systemd-analyze verify fails on a bad setting" verify_units "$scratch/carteiro.service"
  else
    echo "skipped: systemd-analyze verify (no systemd-analyze here)"
  fi
fi
echo "ops: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
