# Sourced by the command-line tests (sh_test with this file in data; the
# working directory is the runfiles root):
#
#   expect_refusal RC WHAT CMD [ARGS...]
#
# runs CMD, killed after ${REFUSAL_TIMEOUT:-30} s, with its stdout in
# $tmp/out.txt and its stderr in $tmp/err.txt, and fails the test (exit 1,
# CMD's stderr shown) unless CMD exited RC with WHAT (a grep pattern) in its
# stderr. The caller sets $tmp and `set -e`; tests add their own checks of
# $tmp/out.txt (nothing measured, trained or written before the refusal).
expect_refusal() {
  local rc_want="$1" what="$2"
  shift 2
  set +e
  timeout "${REFUSAL_TIMEOUT:-30}" "$@" > "$tmp/out.txt" 2> "$tmp/err.txt"
  local rc=$?
  set -e
  [[ $rc -eq $rc_want ]] || { cat "$tmp/err.txt"; echo "FAIL: $* exited $rc, expected $rc_want" >&2; exit 1; }
  grep -q -- "$what" "$tmp/err.txt" || { cat "$tmp/err.txt"; echo "FAIL: $* message lacks '$what'" >&2; exit 1; }
}
