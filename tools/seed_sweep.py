#!/usr/bin/env python3
"""Runs the test suite under many TRAINC_TEST_SEED values and BLAS thread
counts, several test processes at a time, and prints one line per test with
its failures. Every test must pass for every seed and thread count.

    python3 tools/seed_sweep.py [--build build] [--seeds 20] [--first 1] [--threads 1,2] [--jobs N] [-R REGEX]

Tests come from `ctest --show-only=json-v1` with their command, environment,
working folder, skip code and pass expression. Exit status 1 when any run fails."""
import argparse, concurrent.futures as cf, json, os, re, signal, subprocess, sys, time


def ctest_tests(build, regex):
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], check=True,
                         capture_output=True, text=True).stdout
    tests = []
    for t in json.loads(out)["tests"]:
        if regex and not re.search(regex, t["name"]):
            continue
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        tests.append({"name": t["name"], "command": t["command"],
                      "env": dict(e.split("=", 1) for e in props.get("ENVIRONMENT", [])),
                      "cwd": props.get("WORKING_DIRECTORY", "."), "skip": props.get("SKIP_RETURN_CODE"),
                      "pass_regex": props.get("PASS_REGULAR_EXPRESSION"), "timeout": props.get("TIMEOUT", 600)})
    return tests


def run_one(test, seed, threads):
    # Ranks waiting in MPI yield the core instead of spinning: many jobs share the cores.
    env = dict(os.environ, **test["env"], TRAINC_TEST_SEED=str(seed), OPENBLAS_NUM_THREADS=str(threads),
               OMPI_MCA_mpi_yield_when_idle="1")
    start = time.time()
    try:
        p = subprocess.run(test["command"], cwd=test["cwd"], env=env, capture_output=True, text=True,
                           timeout=test["timeout"])
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        out, rc = "timed out", -1
    if test["pass_regex"]:
        ok = any(re.search(r, out) for r in test["pass_regex"])
    else:
        ok = rc == 0 or rc == test["skip"]
    return test["name"], seed, threads, ok, rc == test["skip"], time.time() - start, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", type=int, default=20, help="how many seeds (k, k+1, ..., times a large odd number)")
    ap.add_argument("--first", type=int, default=1, help="k, the first seed's index")
    ap.add_argument("--threads", default="1,2", help="OPENBLAS_NUM_THREADS values")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("-R", dest="regex", help="only tests whose name matches")
    a = ap.parse_args()
    tests = ctest_tests(a.build, a.regex)
    seeds = [(a.first + i) * 2654435761 for i in range(a.seeds)]
    # Seed by seed, so that a time limit leaves whole seeds done.
    runs = [(t, s, n) for s in seeds for n in map(int, a.threads.split(",")) for t in tests]
    failures, by_test = [], {}

    def report():
        for name, st in sorted(by_test.items()):
            print(f"{name:28s} {st['runs']:4d} runs  {st['failed']:3d} failed  {st['skipped']:3d} skipped  "
                  f"{st['secs'] / st['runs']:6.1f} s each")
        for name, seed, threads, out in failures:
            tail = "\n    ".join(out.strip().splitlines()[-8:])
            print(f"FAILED {name} TRAINC_TEST_SEED={seed} OPENBLAS_NUM_THREADS={threads}\n    {tail}")
        total = sum(st["runs"] for st in by_test.values())
        print(f"{total - len(failures)} passed, {len(failures)} failed (of {len(runs)} runs)", flush=True)

    # A time limit (SIGTERM) still prints what finished.
    signal.signal(signal.SIGTERM, lambda *_: (report(), os._exit(1)))
    with cf.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for name, seed, threads, ok, skipped, secs, out in pool.map(lambda r: run_one(*r), runs):
            st = by_test.setdefault(name, {"runs": 0, "failed": 0, "skipped": 0, "secs": 0.0})
            st["runs"] += 1
            st["secs"] += secs
            st["skipped"] += skipped
            if not ok:
                st["failed"] += 1
                failures.append((name, seed, threads, out))
                print(f"failed: {name} TRAINC_TEST_SEED={seed} OPENBLAS_NUM_THREADS={threads}", flush=True)
    report()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
