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
