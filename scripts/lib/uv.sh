# Sourced by scripts/setup.sh and scripts/update-deps.sh (from the
# repository's root): the pinned uv, and the check that uv.lock matches
# pyproject.toml. docs/testing.md ("Dependencies: one lock") says why.

PYTHON_BIN="${PYTHON_BIN:-python3}"
# The interpreter is this machine's (uv never downloads one), and nothing
# here reads a user's uv configuration.
export UV_PYTHON_DOWNLOADS=never UV_NO_CONFIG=1 UV_PROJECT_ENVIRONMENT=.venv
UV_TOOL=".uv-tool"
UV="$UV_TOOL/bin/uv"

# uv is the one package pip installs: requirements/uv.txt pins one release
# with the hash of each of its wheels, into a tool environment of its own,
# reinstalled when that file changes.
ensure_uv() {
  local want
  want="$(sha256sum requirements/uv.txt | cut -d' ' -f1)"
  if [ -x "$UV" ] && [ "$(cat "$UV_TOOL/.stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "== installing uv (requirements/uv.txt)"
  rm -rf "$UV_TOOL"
  "$PYTHON_BIN" -m venv "$UV_TOOL"
  # Hash-checking mode: a file whose hash is not listed is refused.
  "$UV_TOOL/bin/python" -m pip install -q --require-hashes --no-deps -r requirements/uv.txt \
    2>&1 | grep -v '^WARNING: Location' || true
  "$UV" --version >/dev/null
  echo "$want" > "$UV_TOOL/.stamp"
}

# Fails, naming the command that fixes it, when pyproject.toml's
# dependencies and uv.lock disagree. Resolves nothing when they agree.
check_lock() {
  local out
  if ! out="$("$UV" lock --check --python "$PYTHON_BIN" 2>&1)"; then
    echo "$out" >&2
    echo "uv.lock does not match pyproject.toml's dependencies: run 'bash scripts/update-deps.sh'" \
         "to refresh the lock, then commit uv.lock with pyproject.toml (docs/testing.md)." >&2
    return 1
  fi
}
