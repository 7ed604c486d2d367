// Package nspid finds, from the host, a process that a test's step described from inside
// its PID namespace. A step in pid-namespace mode has a /proc of its own: its $$ and
// /proc/self are the namespace's numbers, which mean nothing to the test. The step
// prints its namespace and its number there (Shell); Host finds the host's PID with
// both (/proc/PID/ns/pid and the last field of NSpid in /proc/PID/status). Where the
// step saw the host's /proc, its number is the host's, and Host returns it.
package nspid

import (
	"os"
	"strconv"
	"strings"
)

// Shell is shell that prints the shell's own PID namespace and PID in it, for Host: "pid:[N] P".
// (read is a builtin, so /proc/self is the shell itself; readlink of /proc/self/ns/pid
// names the namespace of readlink, the same.)
const Shell = `read hp _ < /proc/self/stat; echo "$(readlink /proc/self/ns/pid) $hp"`

// Gone is what Host returns for a process whose whole namespace has ended (every
// process in it is dead): a number above the kernel's largest PID (2^22), so that no
// process has it, and kill(2) of it reaches none (unlike 0 or -1).
const Gone = 1 << 30

// Host returns the host's PID of the process Shell described in text, if it is alive,
// or Gone if its namespace has no process left; a bare number is returned as it is.
// Not found in a namespace that has processes: false (it may not be there yet, or be
// dead while others live).
func Host(text string) (int, bool) {
	text = strings.TrimSpace(text)
	if n, err := strconv.Atoi(text); err == nil {
		return n, true
	}
	ns, nsPid, ok := strings.Cut(text, " ")
	want, err := strconv.Atoi(nsPid)
	if !ok || err != nil {
		return 0, false
	}
	// In this process's own namespace (subreaper mode), or without a /proc of its own
	// (user-pid-namespace mode), the step read the host's number.
	if self, err := os.Readlink("/proc/self/ns/pid"); err == nil && self == ns {
		return want, true
	}
	if link, err := os.Readlink("/proc/" + nsPid + "/ns/pid"); err == nil && link == ns {
		return want, true
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	inNS := false
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err != nil || link != ns {
			continue
		}
		inNS = true
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 && f[len(f)-1] == strconv.Itoa(want) {
					return pid, true
				}
			}
		}
	}
	if !inNS {
		return Gone, true
	}
	return 0, false
}
