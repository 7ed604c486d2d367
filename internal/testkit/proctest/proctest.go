// Package proctest holds what tests that start and kill real processes need to look at
// them: whether a process is alive. Tests only; production code does not import it.
package proctest

import (
	"os"
	"strconv"
	"strings"
)

// Alive reports whether pid is a live process (Linux /proc; a zombie counts as dead:
// it was killed, only its parent has not reaped it).
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}
