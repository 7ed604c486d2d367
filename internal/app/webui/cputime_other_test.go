//go:build !linux

package webui

import "time"

var began = time.Now()

// threadCPU is wall time where no thread CPU clock is read (the suite runs on Linux).
func threadCPU() time.Duration { return time.Since(began) }
