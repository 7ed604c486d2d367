package steps

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The capabilities that changing a child's user and groups needs (capability.h).
const (
	capSetgid = 6
	capSetuid = 7
)

// canSwitchUser reports whether this process holds CAP_SETUID and CAP_SETGID (root
// normally does; a container may have dropped them; another user may have been given
// them, e.g. with systemd's AmbientCapabilities=).
func canSwitchUser() error {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return fmt.Errorf("steps: cannot read this process's capabilities: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				break
			}
			if caps&(1<<capSetuid) == 0 || caps&(1<<capSetgid) == 0 {
				return fmt.Errorf("steps: this process (uid %d) may not change a command's user: run flowd as root, or give it CAP_SETUID and CAP_SETGID (systemd: AmbientCapabilities=CAP_SETUID CAP_SETGID)", os.Geteuid())
			}
			return nil
		}
	}
	return fmt.Errorf("steps: cannot read this process's capabilities from /proc/self/status")
}
