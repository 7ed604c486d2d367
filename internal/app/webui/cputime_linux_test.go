package webui

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID): with
// the goroutine locked to its thread, the work done between two reads, whatever else
// the machine is doing meanwhile.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// processCPU is the CPU time the whole process has used (user and system): what a
// benchmark's node spent, whatever else the machine is doing meanwhile.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
