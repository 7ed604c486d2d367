//go:build !linux

package steps

import (
	"fmt"
	"os"
)

// canSwitchUser: elsewhere than Linux, only root may change a command's user.
func canSwitchUser() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("steps: this process (uid %d) may not change a command's user: run flowd as root", os.Geteuid())
	}
	return nil
}
