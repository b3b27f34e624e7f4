#!/usr/bin/env bash
# On the lent GPU: per-kernel times of trainc's first training steps (ncu), to
# see where a step goes. Usage: profile_step.sh CONFIG [--set k=v]...
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh > /dev/null || exit 1
ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 70 \
  build/trainc --config "$@" --set run.max_steps=2 --set run.eval=off --set data.resident=on \
  > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
tot = collections.OrderedDict()
for r in rows:
    v = float(r[vi].replace(",", "")) * {"ns": 1e-3, "us": 1, "usecond": 1, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(r[ui], 1)
    print(f"{v:10.1f} us  {r[ki][:110]}")
PY
