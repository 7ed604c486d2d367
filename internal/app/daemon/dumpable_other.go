//go:build !linux

package daemon

// notDumpable: only Linux has prctl(PR_SET_DUMPABLE).
func notDumpable() (bool, error) { return false, nil }
