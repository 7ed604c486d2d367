//go:build !linux

package webui

import "time"

var began = time.Now()

// threadCPU is wall time where no thread CPU clock is read (the suite runs on Linux).
func threadCPU() time.Duration { return time.Since(began) }

// processCPU is wall time where no process CPU clock is read.
func processCPU() time.Duration { return time.Since(began) }
