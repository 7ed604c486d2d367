//go:build !linux

package flowd

// notDumpable: only Linux has prctl(PR_SET_DUMPABLE).
func notDumpable() (bool, error) { return false, nil }
