"""Summarises an `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active,
temperature.gpu --format=csv,noheader -lms 100` log per segment of a marks file (lines "HH:MM:SS.ffffff NAME" from
`echo "$(date -u +%H:%M:%S.%N) NAME"` before each run): median SM clock, median power, the share of samples
under the software power cap (throttle reason 0x4) and the median GPU temperature (a fifth column, when
logged), over the samples drawing more than 200 W.
Usage: python3 bench/clock_log.py smi.csv marks.txt"""
import csv
import statistics
import sys


def main(smi_path, marks_path):
    marks = []
    for line in open(marks_path):
        parts = line.split(maxsplit=1)
        if len(parts) == 2:
            marks.append((parts[0][:12], parts[1].strip()))
    rows = []
    for r in csv.reader(open(smi_path)):
        if len(r) < 4:
            continue
        t = r[0].strip().split()[-1][:12]
        try:
            clock = float(r[1].split()[0])
            power = float(r[2].split()[0])
        except ValueError:
            continue
        try:
            capped = int(r[3].strip(), 16) & 0x4 != 0
        except ValueError:
            continue
        try:
            temp = float(r[4].split()[0]) if len(r) > 4 else None
        except ValueError:
            temp = None
        rows.append((t, clock, power, capped, temp))
    print("| segment | samples > 200 W | median SM MHz | median W | power-capped | median °C |")
    print("|---|--:|--:|--:|--:|--:|")
    for i, (start, name) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else "99"
        busy = [r for r in rows if start <= r[0] < end and r[2] > 200]
        if not busy:
            print(f"| {name} | 0 | – | – | – | – |")
            continue
        capped = sum(1 for r in busy if r[3]) / len(busy)
        temps = [r[4] for r in busy if r[4] is not None]
        temp = f"{statistics.median(temps):.0f}" if temps else "–"
        print(f"| {name} | {len(busy)} | {statistics.median(r[1] for r in busy):.0f} | "
              f"{statistics.median(r[2] for r in busy):.0f} | {100 * capped:.0f}% | {temp} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
