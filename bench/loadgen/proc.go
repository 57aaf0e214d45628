package main

// What this process costs: resident memory and CPU, read the way bench/measure.py reads
// its own (VmRSS; user + system time of all threads).

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

func rssMiB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		if rest, ok := strings.CutPrefix(scanner.Text(), "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if kib, err := strconv.ParseFloat(fields[0], 64); err == nil {
				return round1(kib / 1024)
			}
		}
	}
	return -1
}

func cpuSeconds() float64 {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// cpuWindow is CPU use between two readings, in percent of one core.
type cpuWindow struct{ cpu, at float64 }

func startCPU() cpuWindow { return cpuWindow{cpuSeconds(), monotonic()} }

// take returns the percentage since the last take (or start) and starts again.
func (w *cpuWindow) take() float64 {
	cpu, at := cpuSeconds(), monotonic()
	pct := 0.0
	if at > w.at {
		pct = round1(100 * (cpu - w.cpu) / (at - w.at))
	}
	w.cpu, w.at = cpu, at
	return pct
}
