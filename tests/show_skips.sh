#!/bin/sh
# Run by ctest after the tests (CTEST_CUSTOM_POST_TEST, see CMakeLists.txt):
# ctest reports a skipped test only as "***Skipped", so this prints the reason
# each skipped test gave, its "SKIP: reason" lines (tests/harness.c,
# test_skip), from the run's log. Usage: show_skips.sh BUILD_DIR
# It never fails the run: no log, or no skips, prints nothing.
dir="${1:-.}/Testing/Temporary"
# While ctest runs, the log is LastTest.log.tmp (LastTest_<stamp>.log.tmp in
# dashboard mode); take the newest, or a finished one when there is none.
log=$(ls -t "$dir"/LastTest*.log.tmp 2>/dev/null | head -n 1)
[ -n "$log" ] || log=$(ls -t "$dir"/LastTest*.log 2>/dev/null | head -n 1)
[ -n "$log" ] && [ -r "$log" ] || exit 0
awk '
    /^[0-9]+\/[0-9]+ Test: / { name = $3; in_output = 0; next }
    /^Output:$/ { in_output = 1; next }
    /^<end of output>$/ { in_output = 0; next }
    in_output && /^SKIP: / {
        reason = substr($0, 7)
        if (seen[name, reason]++) next
        if (!(name in reasons)) { order[n++] = name; reasons[name] = reason }
        else reasons[name] = reasons[name] "; " reason
    }
    END {
        if (n == 0) exit 0
        print "\nWhy tests were skipped:"
        for (i = 0; i < n; i++) printf "  %s: %s\n", order[i], reasons[order[i]]
    }
' "$log"
exit 0
